"""The frames between a worker and worker 0 for the models only worker 0 serves (`_forwarding`).

A frame is two lengths (header, payload), a JSON header and the payload: the tensors' bytes
one after another, each described in the header as `[name, datatype, shape, byte size]`. A
BYTES tensor travels as on the v2 wire (a 4-byte length before each element). The header says
what the frame is: a request (`model`), a response to request `n`, an error of request `n`, a
cancel of request `n`, worker 0's report of the states of its models (`states`), or a trace
for worker 0's Triton-format trace file (`trace`: the payload is its entries).
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from coreserve.errors import InvalidArgumentError
from coreserve.protocol.bytes_codec import decode_bytes_tensor, encode_bytes_tensor
from coreserve.server.workers._trust import MALFORMED, OVERSIZED
from coreserve.types import DataType, InferenceRequest, InferenceResponse

_LENGTHS = struct.Struct("!IQ")
MAX_HEADER_BYTES = 64 * 1024 * 1024  # a header lists names, shapes and parameters only
# A request's tensors may be as large as the largest message a frontend takes (a 32-bit length
# does not hold that); a reader refuses more than this.
MAX_PAYLOAD_BYTES = 16 * 1024 * 1024 * 1024

Pieces = list[bytes | memoryview]


@dataclass
class Frame:
    header: dict[str, Any]
    payload: memoryview


class FrameError(InvalidArgumentError):
    """A frame the line must not take (the line is then not to be trusted): `reason` is why,
    as `coreserve_worker_line_errors_total` counts it."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def frame(header: Mapping[str, Any], tensors: Mapping[str, np.ndarray] | None = None) -> Pieces:
    """A frame's bytes in pieces (for `writelines`): `tensors` described in the header's
    `tensors` and sent after it (views of the arrays where they are contiguous)."""
    described: list[list[Any]] = []
    payload: Pieces = []
    size = 0
    for name, array in (tensors or {}).items():
        data = _tensor_bytes(array)
        datatype = DataType.BYTES if array.dtype.kind in "OSU" else DataType.from_numpy(array.dtype)
        described.append([name, datatype.value, list(array.shape), len(data)])
        payload.append(data)
        size += len(data)
    head = orjson.dumps({**header, "tensors": described} if tensors is not None else header)
    return [_LENGTHS.pack(len(head), size), head, *payload]


def payload_size(pieces: Pieces) -> int:
    """The bytes of a frame's tensors (what `read_frame` checks against MAX_PAYLOAD_BYTES)."""
    return int(_LENGTHS.unpack(pieces[0])[1])


def entries_frame(entries: bytes) -> Pieces:
    """A finished trace's entries in Triton's trace file (`trace_entries`), for worker 0's file."""
    head = orjson.dumps({"trace": True})
    return [_LENGTHS.pack(len(head), len(entries)), head, entries]


def _tensor_bytes(array: np.ndarray) -> bytes | memoryview:
    if array.dtype.kind in "OSU":
        return encode_bytes_tensor(array)
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data


def tensors_of(received: Frame) -> dict[str, np.ndarray]:
    """The tensors a frame carries (views of its payload)."""
    tensors: dict[str, np.ndarray] = {}
    offset = 0
    for name, datatype_name, shape, size in received.header.get("tensors", ()):
        data = received.payload[offset : offset + size]
        offset += size
        datatype = DataType(datatype_name)
        count = int(np.prod(shape, dtype=np.int64))
        if datatype is DataType.BYTES:
            array = decode_bytes_tensor(data, count, name)
        else:
            array = np.frombuffer(data, dtype=datatype.numpy_dtype, count=count)
        tensors[name] = array.reshape(shape)
    return tensors


async def read_frame(reader: asyncio.StreamReader) -> Frame | None:
    """The next frame; None at the end of the stream. Raises FrameError for lengths past the
    limits (before anything more is read) or a header that is not a JSON object."""
    try:
        lengths = await reader.readexactly(_LENGTHS.size)
    except asyncio.IncompleteReadError:
        return None
    head_size, payload_size = _LENGTHS.unpack(lengths)
    if head_size > MAX_HEADER_BYTES or payload_size > MAX_PAYLOAD_BYTES:
        raise FrameError(
            f"a frame between workers is too large ({head_size} + {payload_size} bytes)", OVERSIZED
        )
    try:
        head = await reader.readexactly(head_size)
    except asyncio.IncompleteReadError:
        return None
    try:
        header = orjson.loads(head)
    except ValueError:
        header = None
    if not isinstance(header, dict):
        raise FrameError("a frame between workers whose header is not a JSON object", MALFORMED)
    try:
        payload = await reader.readexactly(payload_size) if payload_size else b""
    except asyncio.IncompleteReadError:
        return None
    return Frame(header, memoryview(payload))


def request_frame(number: int, request: InferenceRequest, version: int, interface: str) -> Pieces:
    """A request checked where it arrived (`batch`: its batch size there) for worker 0's
    scheduler of model version `version`; `interface`: the digest of what the configuration it
    was checked against says of requests (`ModelVersion.interface_digest`)."""
    header = {
        "n": number,
        "model": request.model_name,
        "version": version,
        "interface": interface,
        "id": request.id,
        "parameters": request.parameters,
        "outputs": request.requested_outputs,
        "batch": request.batch_size,
    }
    return frame(header, request.inputs)


def request_from(received: Frame) -> InferenceRequest:
    header = received.header
    outputs = header["outputs"]
    return InferenceRequest(
        model_name=header["model"],
        inputs=tensors_of(received),
        model_version=str(header["version"]),
        id=header["id"],
        parameters=header["parameters"],
        requested_outputs=tuple(outputs) if outputs is not None else None,
        batch_size=header["batch"],
    )


def response_frame(number: int, response: InferenceResponse | None, final: bool) -> Pieces:
    if response is None:
        return frame({"n": number, "final": final, "empty": True})
    header = {
        "n": number,
        "final": final,
        "version": response.model_version,
        "id": response.id,
        "parameters": response.parameters,
    }
    return frame(header, response.outputs)


def response_from(received: Frame, model_name: str) -> InferenceResponse | None:
    header = received.header
    if header.get("empty"):
        return None
    return InferenceResponse(
        model_name=model_name,
        model_version=header["version"],
        outputs=tensors_of(received),
        id=header["id"],
        parameters=header["parameters"],
    )
