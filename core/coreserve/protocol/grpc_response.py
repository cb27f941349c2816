"""KServe v2 gRPC responses: InferenceResponses → ModelInferResponse messages.

Outputs travel in `raw_output_contents` (what tritonclient expects), or in a shared memory
region the request named. The serializers write the message's bytes without building the
whole message in protobuf, and leave a large one in pieces (see SerializedPieces).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from coreserve.protocol._grpc_codec import set_parameter
from coreserve.protocol._shared_memory import OutputInSharedMemory, write_output
from coreserve.protocol.output_plan import DEFAULT_PLAN, OutputPlan
from coreserve.protocol.tensors import array_to_bytes
from coreserve.protos import grpc_service_pb2 as pb
from coreserve.types import DataType, InferenceResponse, ParameterValue


def encode_model_infer_response(
    response: InferenceResponse, plan: OutputPlan = DEFAULT_PLAN
) -> pb.ModelInferResponse:
    """Encodes a response with every output in raw_output_contents, as Triton does.

    Outputs in the plan's shared memory are written into their regions and, as Triton sends
    them, keep an empty raw_output_contents entry (so that the entries still line up with the
    outputs).
    """
    message, raw = _response_without_raw(response, plan.shared_memory)
    message.raw_output_contents.extend(data if isinstance(data, bytes) else data.tobytes() for data in raw)
    return message


class SerializedPieces(NamedTuple):
    """A serialized message as the pieces it is made of, not joined: a server that writes them
    one after the other to its socket saves a copy of the message's large contents."""

    pieces: list[bytes | memoryview]
    size: int

    def joined(self) -> bytes:
        return b"".join(self.pieces)


# Serialized messages of at least this many bytes stay in pieces (smaller ones: one write is
# cheaper than several, and the copy costs little).
UNJOINED_BYTES = 64 * 1024


def serialize_model_infer_response(
    response: InferenceResponse, plan: OutputPlan = DEFAULT_PLAN
) -> bytes | SerializedPieces:
    """encode_model_infer_response's message, serialized, with each output copied once or never.

    protobuf would copy an output three times (to bytes, into its arena, into the serialized
    message); here the raw_output_contents entries are written after the rest of the message,
    where protobuf writes them too (the highest field number last): the bytes are the same.
    A large message comes as its pieces (see SerializedPieces), its outputs' bytes not copied.
    """
    return _joined_unless_large(*_serialized_pieces(response, plan.shared_memory))


def serialize_model_stream_infer_response(
    response: InferenceResponse,
    plan: OutputPlan = DEFAULT_PLAN,
    parameters: Mapping[str, ParameterValue] | None = None,
) -> bytes | SerializedPieces:
    """A ModelStreamInferResponse carrying serialize_model_infer_response's message, serialized.

    `parameters` are added to the response's own (the streaming protocol's final flag).
    """
    pieces, size = _serialized_pieces(response, plan.shared_memory, parameters)
    head = _INFER_RESPONSE_KEY + _varint_bytes(size)
    return _joined_unless_large([head, *pieces], len(head) + size)


def _joined_unless_large(pieces: list[bytes | memoryview], size: int) -> bytes | SerializedPieces:
    return SerializedPieces(pieces, size) if size >= UNJOINED_BYTES else b"".join(pieces)


def _serialized_pieces(
    response: InferenceResponse,
    shared_memory: dict[str, OutputInSharedMemory] | None,
    parameters: Mapping[str, ParameterValue] | None = None,
) -> tuple[list[bytes | memoryview], int]:
    """The pieces of a serialized ModelInferResponse, and their total size."""
    if shared_memory or parameters or response.parameters:
        message, raw = _response_without_raw(response, shared_memory)
        for key, value in (parameters or {}).items():
            set_parameter(message.parameters[key], value)
        header = message.SerializeToString()
    else:
        header, raw = _plain_header(response)
    pieces: list[bytes | memoryview] = [header]
    size = len(header)
    for data in raw:
        length = _varint_bytes(len(data))
        pieces += (_RAW_OUTPUT_CONTENTS_KEY, length, data)
        size += len(_RAW_OUTPUT_CONTENTS_KEY) + len(length) + len(data)
    return pieces, size


def _plain_header(response: InferenceResponse) -> tuple[bytes, list[bytes | memoryview]]:
    """The serialized message of a response without parameters or shared memory, less its raw
    contents, and those contents. Its header is the same for every response of one model with
    the same id and outputs' names, datatypes and shapes: made once, then taken from a cache."""
    outputs = response.outputs
    signature = (
        response.model_name,
        response.model_version,
        response.id,
        *[(name, array.dtype, array.shape) for name, array in outputs.items()],
    )
    header = _PLAIN_HEADERS.get(signature)
    if header is None:
        message, raw = _response_without_raw(response, None)
        header = message.SerializeToString()
        if len(_PLAIN_HEADERS) >= PLAIN_HEADERS:  # ids or shapes that vary must not grow it unbounded
            _PLAIN_HEADERS.clear()
        _PLAIN_HEADERS[signature] = header
        return header, raw
    return header, [array_to_bytes(array, DataType.from_numpy(array.dtype)) for array in outputs.values()]


# Headers remembered by _plain_header (a few per model, unless clients vary ids or shapes).
PLAIN_HEADERS = 1024
_PLAIN_HEADERS: dict[tuple[object, ...], bytes] = {}


# The key of ModelInferResponse.raw_output_contents (field 6, length-delimited).
_RAW_OUTPUT_CONTENTS_KEY = bytes([6 << 3 | 2])
# The key of ModelStreamInferResponse.infer_response (field 2, length-delimited).
_INFER_RESPONSE_KEY = bytes([2 << 3 | 2])


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _response_without_raw(
    response: InferenceResponse, shared_memory: dict[str, OutputInSharedMemory] | None
) -> tuple[pb.ModelInferResponse, list[bytes | memoryview]]:
    message = pb.ModelInferResponse(
        model_name=response.model_name, model_version=response.model_version, id=response.id
    )
    for key, value in response.parameters.items():
        set_parameter(message.parameters[key], value)
    raw: list[bytes | memoryview] = []
    for name, array in response.outputs.items():
        datatype = DataType.from_numpy(array.dtype)
        message.outputs.add(name=name, datatype=datatype.value, shape=array.shape)
        target = shared_memory.get(name) if shared_memory else None
        if target is not None:
            write_output(target, array, datatype, name)
            raw.append(b"")
        else:
            raw.append(array_to_bytes(array, datatype))
    return message, raw
