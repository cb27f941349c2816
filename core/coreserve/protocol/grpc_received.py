"""ModelInferRequests as received: parsed, with large raw contents as views, and the metadata
that clients repeat decoded once.

A client usually sends the same model name, inputs (names, datatypes, shapes) and outputs in
every request; only the bytes in raw_input_contents change. Protobuf writes fields in the order
of their numbers, so raw_input_contents (7) comes last: such requests share a prefix of
metadata bytes (but for the request id, if the client numbers its requests), followed by their
raw entries. `RequestTemplates` keeps the decoded metadata of recent prefixes. A request that
fits one and goes on with nothing but raw entries is decoded from it, its tensors wrapped from
its own bytes, without protobuf and without reading the message field by field: for a small
request that is most of the decoding (docs/benchmarks.md has the measurement). It is the same message
whichever way it is decoded: fields that follow one another merge, so the prefix's fields, the
id and the entries that follow are the message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from coreserve.errors import CoreserveError, RequestMismatchError, with_request_id
from coreserve.protocol._grpc_codec import decode_model_infer_request
from coreserve.protocol._shared_memory import SharedMemoryRegions
from coreserve.protocol.output_plan import DEFAULT_PLAN, OutputPlan
from coreserve.protocol.tensors import array_from_bytes, check_shape, element_count, parse_datatype
from coreserve.protos import grpc_service_pb2 as pb
from coreserve.types import NUMPY_DTYPES, DataType, InferenceRequest, ParameterValue

# Field numbers of ModelInferRequest.id and .raw_input_contents, and their key bytes.
_ID_FIELD = 3
_ID_KEY = _ID_FIELD << 3 | 2
_RAW_INPUT_CONTENTS = 7
_RAW_ENTRY_KEY = _RAW_INPUT_CONTENTS << 3 | 2
# Below this size a request is parsed whole: copying its raw contents costs less than finding them.
VIEW_RAW_CONTENTS_FROM = 64 * 1024
# Templates kept, most recently used first; and how they are learned (see RequestTemplates).
TEMPLATES = 16
_LEARN_PERIOD = 4096


@dataclass(frozen=True, slots=True)
class RequestTemplate:
    """The decoded metadata of one prefix: all of a request but its id and raw input tensors.

    The prefix is `head` (the fields before the id: model name and version), then the request's
    id field if it has one, then `tail` (parameters, inputs, outputs): a client that numbers its
    requests still repeats the rest.
    """

    head: bytes
    tail: bytes
    message: pb.ModelInferRequest  # head and tail parsed (for error texts and output targets)
    # Per input: name, datatype, shape, and for numeric datatypes the numpy dtype and byte size.
    inputs: tuple[tuple[str, DataType, tuple[int, ...], np.dtype[Any] | None, int], ...]
    parameters: Mapping[str, ParameterValue]  # the request's (copied for each: a frontend may pop)
    requested_outputs: tuple[str, ...] | None

    def request(self, request_id: str, raw: Sequence[memoryview]) -> InferenceRequest:
        """The request this template's prefix makes with its id and `raw` (one entry per input)."""
        message = self.message
        inputs = {}
        for (name, datatype, shape, dtype, size), data in zip(self.inputs, raw, strict=True):
            if dtype is not None and len(data) == size:  # array_from_bytes's common case, inline
                array = np.ndarray(shape, dtype, data)  # (a view, as frombuffer's; cheaper)
                inputs[name] = array if array.flags.aligned else array.copy()
                continue
            try:
                inputs[name] = array_from_bytes(data, datatype, shape, name, message.model_name)
            except RequestMismatchError as exc:  # worded as decode_model_infer_request words it
                raise RequestMismatchError(with_request_id(request_id, exc.message)) from None
        return InferenceRequest(
            model_name=message.model_name,
            model_version=message.model_version,
            id=request_id,
            inputs=inputs,
            parameters=dict(self.parameters),
            requested_outputs=self.requested_outputs,
        )


@dataclass(frozen=True, slots=True)
class ReceivedInferRequest:
    """A ModelInferRequest as received, its raw contents either in the message or in `raw`.

    `raw` holds views into the received bytes for a large request (its message then has no
    raw_input_contents), so that tensors reach the backend without a copy, and for one that
    matched a `template` (which then decodes it).
    """

    message: pb.ModelInferRequest
    raw: Sequence[bytes | memoryview] | None = None
    template: RequestTemplate | None = None
    template_id: str = ""  # the request's id, with a template (whose message has none)

    @property
    def request_id(self) -> str:
        return self.template_id if self.template is not None else self.message.id

    def decode(self, regions: SharedMemoryRegions | None) -> tuple[InferenceRequest, OutputPlan]:
        """The InferenceRequest and its output plan, in one read of the message; raises
        CoreserveError for a request a model cannot take. (A template's request asks nothing
        of its outputs: requests whose outputs have parameters make no template.)"""
        if self.template is not None:
            assert self.raw is not None
            return self.template.request(self.template_id, self.raw), DEFAULT_PLAN  # type: ignore[arg-type]  # views
        return decode_model_infer_request(self.message, regions, self.raw)


class RequestTemplates:
    """The decoded metadata of the prefixes recent requests repeated (see the module's docstring).

    Learned from requests whose fields come in the order of their numbers (as protobuf writes
    them), with no parameters on their inputs or outputs (shared memory and classification are
    read per request; the request's own parameters are part of the prefix), and that decode
    without error. A client whose prefixes keep changing (shapes that vary, say) would cost a
    lesson per request: past TEMPLATES lessons more than four per match, learning pauses until
    the period of _LEARN_PERIOD requests ends.
    """

    def __init__(self) -> None:
        self._templates: list[RequestTemplate] = []
        self._seen = self._matched = self._learned = 0

    def match(self, data: bytes) -> ReceivedInferRequest | None:
        """`data` decoded by the template it fits; None if none does."""
        self._seen += 1
        if self._seen >= _LEARN_PERIOD:
            self._seen = self._matched = self._learned = 0
        templates = self._templates
        for index, template in enumerate(templates):
            if data.startswith(template.head):
                fitted = _fit(template, data)
                if fitted is not None:
                    if index:
                        templates.insert(0, templates.pop(index))
                    self._matched += 1
                    return fitted
        return None

    def learn(self, data: bytes, message: pb.ModelInferRequest) -> None:
        """Keeps a template of `data` (parsed as `message`) if it makes one; see the class."""
        if self._learned > TEMPLATES + 4 * self._matched or not _learnable(message):
            return
        split = _split_length_delimited(data, _RAW_INPUT_CONTENTS)
        if split is None:
            return
        prefix, raw = split
        if not raw or len(raw) != len(message.inputs):
            return  # tensors in the typed contents fields: parsed per request
        if not data.startswith(prefix):
            return  # its raw entries are not all at the end: it would never fit (see _fit)
        around_id = _around_id(prefix)
        if around_id is None:
            return
        head, tail = around_id
        try:
            request, _ = decode_model_infer_request(pb.ModelInferRequest.FromString(prefix), None, raw)
        except CoreserveError:  # its handler decodes it again, and answers the mistake
            return
        metadata = pb.ModelInferRequest.FromString(head + tail)
        self._learned += 1
        template = RequestTemplate(
            head=head,
            tail=tail,
            message=metadata,
            inputs=tuple(_input_spec(tensor) for tensor in metadata.inputs),
            parameters=request.parameters,
            requested_outputs=request.requested_outputs,
        )
        self._templates.insert(0, template)
        del self._templates[TEMPLATES:]


_TEMPLATES = RequestTemplates()


def parse_model_infer_request(data: bytes) -> ReceivedInferRequest:
    """Parses a serialized ModelInferRequest; raises DecodeError as protobuf's parser does.

    A request that repeats a recent one's metadata is matched to its template. A large
    request's raw_input_contents are not parsed: protobuf would copy each into its arena and
    again into a Python bytes object on access; they are cut out of `data` as views and only
    the rest (names, shapes, parameters) goes to protobuf.
    """
    matched = _TEMPLATES.match(data)
    if matched is not None:
        return matched
    if len(data) >= VIEW_RAW_CONTENTS_FROM:
        split = _split_length_delimited(data, _RAW_INPUT_CONTENTS)
        if split is not None:
            rest, raw = split
            message = pb.ModelInferRequest.FromString(rest)
            _TEMPLATES.learn(data, message)
            return ReceivedInferRequest(message, raw)
    message = pb.ModelInferRequest.FromString(data)
    _TEMPLATES.learn(data, message)
    return ReceivedInferRequest(message)


def _input_spec(
    tensor: pb.ModelInferRequest.InferInputTensor,
) -> tuple[str, DataType, tuple[int, ...], np.dtype[Any] | None, int]:
    name = tensor.name
    datatype = parse_datatype(tensor.datatype, name)
    shape = check_shape(tuple(tensor.shape), name)
    if datatype is DataType.BYTES:
        return name, datatype, shape, None, 0
    dtype = NUMPY_DTYPES[datatype]
    return name, datatype, shape, dtype, element_count(shape) * dtype.itemsize


def _learnable(message: pb.ModelInferRequest) -> bool:
    return not any(tensor.parameters for tensor in message.inputs) and not any(
        output.parameters for output in message.outputs
    )


def _fit(template: RequestTemplate, data: bytes) -> ReceivedInferRequest | None:
    """`data` as the template's request, if it is one (it starts with the template's head)."""
    position = len(template.head)
    request_id = ""
    try:
        if position < len(data) and data[position] == _ID_KEY:
            length, body = _varint(data, position + 1)
            position = body + length
            request_id = data[body:position].decode()
        if not data.startswith(template.tail, position):
            return None
        raw = _raw_entries(data, position + len(template.tail))
    except (DecodeError, UnicodeDecodeError):  # protobuf's parser refuses it: it says why
        return None
    if raw is None or len(raw) != len(template.inputs):
        return None
    return ReceivedInferRequest(template.message, raw, template, request_id)


def _around_id(prefix: bytes) -> tuple[bytes, bytes] | None:
    """The fields of `prefix` before the id field and after it (the id left out); None if its
    fields are not in the order of their numbers, with one id at most."""
    numbers, starts, ends = [], [], []
    position = 0
    try:
        while position < len(prefix):
            key, after_key = _varint(prefix, position)
            if key & 7 != 2:  # every top-level field of the message is length-delimited
                return None
            length, body = _varint(prefix, after_key)
            numbers.append(key >> 3)
            starts.append(position)
            position = body + length
            ends.append(position)
    except DecodeError:
        return None
    if numbers != sorted(numbers) or numbers.count(_ID_FIELD) > 1:
        return None
    later = [index for index, number in enumerate(numbers) if number >= _ID_FIELD]
    if not later:
        return prefix, b""
    first = later[0]
    cut = starts[first]
    resume = ends[first] if numbers[first] == _ID_FIELD else cut
    return prefix[:cut], prefix[resume:]


def _raw_entries(data: bytes, start: int) -> list[memoryview] | None:
    """Views of the raw_input_contents entries that make up `data` from `start` to its end;
    None if anything else is there."""
    view = memoryview(data)
    entries = []
    position, end = start, len(data)
    try:
        while position < end:
            if data[position] != _RAW_ENTRY_KEY:
                return None
            length, body = _varint(data, position + 1)
            following = body + length
            if following > end:
                return None
            entries.append(view[body:following])
            position = following
    except DecodeError:
        return None
    return entries


def _split_length_delimited(data: bytes, field: int) -> tuple[bytes, list[memoryview]] | None:
    """The message without its top-level `field` entries, and views of their payloads.

    None when the wire data is malformed: the caller then parses it whole, and protobuf
    raises its own DecodeError.
    """
    view = memoryview(data)
    kept: list[memoryview] = []
    found: list[memoryview] = []
    start = position = 0
    end = len(data)
    try:
        while position < end:
            key, after_key = _varint(data, position)
            wire_type = key & 7
            if wire_type == 2:
                length, body = _varint(data, after_key)
                following = body + length
                if key >> 3 == field and following <= end:
                    kept.append(view[start:position])
                    found.append(view[body:following])
                    start = following
            elif wire_type == 0:
                following = _varint(data, after_key)[1]
            elif wire_type == 1:
                following = after_key + 8
            elif wire_type == 5:
                following = after_key + 4
            else:  # groups, or not a wire type at all
                return None
            if following > end:
                return None
            position = following
    except DecodeError:
        return None
    kept.append(view[start:])
    return b"".join(kept), found


def _varint(data: bytes, position: int) -> tuple[int, int]:
    """The varint at `position` and the position after it."""
    value = shift = 0
    while True:
        if position >= len(data) or shift > 63:
            raise DecodeError("truncated or overlong varint")
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7
