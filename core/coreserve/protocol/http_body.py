"""KServe v2 HTTP inference bodies, with Triton's binary tensor data extension.

A request body is a JSON object, optionally followed by binary tensor data; the
`Inference-Header-Content-Length` header gives the JSON part's length. A header value of 0, or
an empty body without the header, marks a raw request (`is_raw_request`): the whole body is the
data of the model's single input.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from coreserve.config.signature import TensorSpec
from coreserve.errors import (
    CoreserveError,
    InvalidArgumentError,
    RequestMismatchError,
    with_request_id,
)
from coreserve.protocol._request_parameters import check_http_parameters
from coreserve.protocol._shared_memory import (
    REGION,
    SharedMemoryReference,
    SharedMemoryRegions,
    output_target,
    read_input,
    shared_memory_reference,
    write_output,
)
from coreserve.protocol.classification import PARAMETER as CLASSIFICATION
from coreserve.protocol.classification import parse_class_count
from coreserve.protocol.output_plan import OutputPlan
from coreserve.protocol.tensors import (
    array_from_bytes,
    array_from_json,
    array_to_bytes,
    array_to_json,
    check_shape,
    element_count,
    json_loads,
    parse_datatype,
    parse_shape,
)
from coreserve.types import DataType, InferenceRequest, InferenceResponse, ParameterValue

HEADER_LENGTH = "Inference-Header-Content-Length"
# The JSON data of an output of more elements than this is written a slice at a time: one
# orjson call holds the interpreter lock throughout, and on a codec thread the event loop gets
# its turn between two calls.
JSON_SLICE_ELEMENTS = 1 << 18
# A response body larger than this is gathered this much at a time: a single copy of tens of
# megabytes holds the interpreter lock throughout (its fresh pages faulted in).
GATHER_BYTES = 1 << 20
# What stands for such an output's data while the rest of the response is written.
_SLICED = "\x00coreserve: data written in slices\x00"
_SLICED_JSON = orjson.dumps(_SLICED)


@dataclass(slots=True)
class BinaryInput:
    """An input whose data is in the body's binary part, not yet read."""

    name: str
    datatype: DataType
    shape: tuple[int, ...]
    offset: int
    size: int

    def read(self, binary: memoryview, regions: SharedMemoryRegions | None, model_name: str) -> np.ndarray:
        data = binary[self.offset : self.offset + self.size]
        return array_from_bytes(data, self.datatype, self.shape, self.name, model_name)


@dataclass(slots=True)
class SharedMemoryInput:
    """An input whose data is in a shared-memory region, not yet read."""

    name: str
    datatype: DataType
    shape: tuple[int, ...]
    reference: SharedMemoryReference

    def read(self, binary: memoryview, regions: SharedMemoryRegions | None, model_name: str) -> np.ndarray:
        return read_input(regions, self.reference, self.datatype, self.shape, self.name, model_name)


@dataclass(slots=True)
class InferDocument:
    """The JSON part of a request body, parsed: the costly part of decoding, with no server state.

    It holds the inputs given as JSON data as arrays, and the others as where to read them; it
    pickles cheaply (a worker process may parse large bodies). `error` is the client error that
    stopped the inputs' decoding, after the entries of `inputs`: reading those comes first, so
    that a request gets the error it would get were every input decoded in order.
    """

    id: str
    inputs: dict[str, np.ndarray | BinaryInput | SharedMemoryInput]  # in the body's order
    error: CoreserveError | None
    parameters: object  # as the JSON has them; checked with the server's state at hand
    outputs: object


def parse_infer_document(
    header: bytes | bytearray | memoryview, binary_size: int, model_name: str
) -> InferDocument:
    """Parses a request body's JSON part; `binary_size`: how many bytes of binary data follow it."""
    try:
        document = json_loads(header)
    except orjson.JSONDecodeError as exc:
        raise InvalidArgumentError(f"malformed JSON in the request body: {exc}") from None
    if not isinstance(document, dict):
        raise InvalidArgumentError("the request body must be a JSON object")
    request_id = document.get("id", "")
    if not isinstance(request_id, str):
        raise InvalidArgumentError("request 'id' must be a string")
    inputs_json = document.get("inputs")
    if not isinstance(inputs_json, list):
        raise InvalidArgumentError("the request needs 'inputs': a list of input tensors")
    inputs: dict[str, np.ndarray | BinaryInput | SharedMemoryInput] = {}
    error = None
    try:
        _parse_inputs(inputs_json, binary_size, model_name, inputs)
    except CoreserveError as exc:
        error = exc.with_traceback(None)  # its frames would hold the whole document
    return InferDocument(request_id, inputs, error, document.get("parameters"), document.get("outputs"))


def _parse_inputs(
    inputs_json: list[Any],
    binary_size: int,
    model_name: str,
    inputs: dict[str, np.ndarray | BinaryInput | SharedMemoryInput],
) -> None:
    """Adds to `inputs` each input of the JSON part: its array, or where its data lies."""
    offset = 0
    for item in inputs_json:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise InvalidArgumentError("every input needs a 'name' string")
        name = item["name"]
        if name in inputs:
            raise RequestMismatchError(f"input '{name}' already exists in request")
        datatype = parse_datatype(item.get("datatype"), name)
        shape = parse_shape(item.get("shape"), name)
        parameters = parse_parameters(item.get("parameters"), f"input '{name}'")
        _check_one_source(name, item, parameters)
        in_shared_memory = shared_memory_reference(parameters, f"input '{name}'")
        size = parameters.get("binary_data_size")
        if in_shared_memory is not None:
            inputs[name] = SharedMemoryInput(name, datatype, shape, in_shared_memory)
        elif size is not None:
            if type(size) is not int or size < 0:
                raise InvalidArgumentError(f"input '{name}': binary_data_size must be a non-negative integer")
            if offset + size > binary_size:
                missing = offset + size - binary_size
                raise InvalidArgumentError(
                    f"unexpected size for input '{name}', expecting {missing} additional bytes for model "
                    f"'{model_name}' (it announces {size} bytes of binary data, "
                    f"{binary_size - offset} remain in the body)"
                )
            inputs[name] = BinaryInput(name, datatype, shape, offset, size)
            offset += size
        else:
            inputs[name] = array_from_json(item["data"], datatype, shape, name)
    if offset != binary_size:
        raise InvalidArgumentError(
            f"the body holds {binary_size - offset} bytes of binary data that no input claims"
        )


def _check_one_source(name: str, item: dict[str, Any], parameters: Mapping[str, object]) -> None:
    """An input's data comes from exactly one place, as Triton checks (in its words)."""
    places = (("data", item), ("binary_data_size", parameters), (REGION, parameters))
    found = [f"'{key}'" for key, holder in places if key in holder]
    if len(found) != 1:
        said = f"set {' '.join(found)}" if found else "no field is set"
        raise InvalidArgumentError(
            "Input must set only one of the following fields: 'data', 'binary_data_size' in "
            f"'parameters', 'shared_memory_region' in 'parameters'. But {said} (input '{name}')"
        )


def split_infer_body(body: bytes | bytearray, header_length: int | None) -> tuple[memoryview, memoryview]:
    """A request body's JSON part and binary part (empty without `header_length`), read-only
    whatever the body is (a body gathered from several reads is a bytearray): the input arrays
    made from it must not let a model change the request."""
    view = memoryview(body).toreadonly()
    if header_length is None:
        return view, view[len(view) :]
    if not 0 < header_length <= len(view):
        raise InvalidArgumentError(
            f"{HEADER_LENGTH} is {header_length}, but the body holds {len(view)} bytes"
        )
    return view[:header_length], view[header_length:]


def is_raw_request(body: bytes | bytearray, header_length: int | None) -> bool:
    """Whether a body is the raw data of the model's single input: a header length of 0, or an
    empty body without the header (as Triton, whose header length defaults to the body's)."""
    return header_length == 0 or (header_length is None and not body)


def decode_infer_request(
    body: bytes | bytearray,
    header_length: int | None,
    model_name: str,
    model_version: str,
    regions: SharedMemoryRegions | None = None,
) -> tuple[InferenceRequest, OutputPlan]:
    """Decodes a JSON (+ binary) inference request body; `regions` serves shared-memory tensors."""
    header, binary = split_infer_body(body, header_length)
    document = parse_infer_document(header, len(binary), model_name)
    return complete_infer_request(document, binary, model_name, model_version, regions)


def complete_infer_request(
    document: InferDocument,
    binary: memoryview,
    model_name: str,
    model_version: str,
    regions: SharedMemoryRegions | None = None,
) -> tuple[InferenceRequest, OutputPlan]:
    """The request of a parsed JSON part: its inputs read from `binary` and shared memory."""
    request_id = document.id
    inputs: dict[str, np.ndarray] = {}
    try:
        for name, value in document.inputs.items():
            inputs[name] = value if isinstance(value, np.ndarray) else value.read(binary, regions, model_name)
        if document.error is not None:
            raise document.error
    except RequestMismatchError as exc:  # Triton names the request in these
        raise RequestMismatchError(with_request_id(request_id, exc.message)) from None

    request_parameters = document.parameters
    if isinstance(request_parameters, dict):
        check_http_parameters(request_parameters)
    parameters = parse_parameters(request_parameters, "the request")
    plan = OutputPlan(binary_by_default=parameters.pop("binary_data_output", False) is True)
    class_counts: dict[str, int] = {}
    requested = _requested_outputs(document.outputs, plan, class_counts, regions)
    request = InferenceRequest(
        model_name=model_name,
        model_version=model_version,
        id=request_id,
        inputs=inputs,
        parameters=parameters,
        requested_outputs=requested,
        class_counts=class_counts or None,
    )
    return request, plan


def decode_raw_infer_request(
    body: bytes | bytearray, spec: TensorSpec, batching: bool, model_name: str, model_version: str
) -> tuple[InferenceRequest, OutputPlan]:
    """Decodes a raw request: the body is the data of the model's only input."""
    try:
        array = _raw_input(body, spec, batching, model_name)
    except RequestMismatchError as exc:  # Triton names the request (a raw one has no id)
        raise RequestMismatchError(with_request_id("", exc.message)) from None
    request = InferenceRequest(model_name=model_name, model_version=model_version, inputs={spec.name: array})
    return request, OutputPlan(binary_by_default=True)


def _raw_input(body: bytes | bytearray, spec: TensorSpec, batching: bool, model_name: str) -> np.ndarray:
    """As Triton: BYTES data is one element holding the whole body, for an input of one element
    only. For other types the shape comes from the configuration's dims (batch size 1), with
    one -1 dimension deduced from the size; a body of another size fails the byte size check."""
    name = spec.name
    dims = list(spec.dims)
    if dims.count(-1) > 1:
        raise RequestMismatchError(
            f"The shape of the raw input '{name}' can not be deduced because there are more than one "
            "variable-sized dimension"
        )
    if spec.datatype is DataType.BYTES:
        if -1 in dims or element_count(dims) != 1:
            raise RequestMismatchError(
                f"For BYTE datatype raw input '{name}', the model must have input shape [1]"
            )
        array = np.empty(check_shape((1,) * (len(dims) + (1 if batching else 0)), name), dtype=np.object_)
        array.reshape(-1)[0] = bytes(body)
        return array
    if -1 in dims:
        known = element_count([dim for dim in dims if dim != -1]) * spec.datatype.numpy_dtype.itemsize
        dims[dims.index(-1)] = len(body) // known if known else 0
    # The dims come from the model's configuration, which may ask for more than numpy holds.
    shape = check_shape(tuple([1, *dims] if batching else dims), name)
    return array_from_bytes(memoryview(body).toreadonly(), spec.datatype, shape, name, model_name)


def encode_infer_response(
    response: InferenceResponse, plan: OutputPlan
) -> tuple[bytes | bytearray, int | None]:
    """Encodes a response; returns the body and the JSON part's length when binary data follows."""
    outputs_json = []
    chunks: list[bytes | memoryview] = []
    binary_size = 0
    sliced: list[tuple[dict[str, Any], np.ndarray, DataType]] = []
    for name, array in response.outputs.items():
        datatype = DataType.from_numpy(array.dtype)
        output: dict[str, Any] = {"name": name, "datatype": datatype.value, "shape": list(array.shape)}
        target = plan.shared_memory.get(name)
        if target is not None:  # written into the region; the response says no more, as Triton's
            write_output(target, array, datatype, name)
        elif plan.is_binary(name):
            data = array_to_bytes(array, datatype)
            size = len(data) if isinstance(data, bytes) else data.nbytes
            output["parameters"] = {"binary_data_size": size}
            chunks.append(data)
            binary_size += size
        elif array.size > JSON_SLICE_ELEMENTS:
            output["data"] = _SLICED
            sliced.append((output, array, datatype))
        else:
            output["data"] = array_to_json(array, datatype, name)
        outputs_json.append(output)
    document: dict[str, Any] = {
        "model_name": response.model_name,
        "model_version": response.model_version,
        "outputs": outputs_json,
    }
    if response.id:
        document["id"] = response.id
    if response.parameters:
        document["parameters"] = response.parameters
    header = orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY)
    json_part = _with_sliced_data(header, document, sliced) if sliced else header
    if not chunks:
        return json_part, None
    if len(json_part) + binary_size < GATHER_BYTES:
        return b"".join([json_part, *chunks]), len(json_part)
    return _gathered([json_part, *chunks]), len(json_part)


def _with_sliced_data(
    header: bytes, document: dict[str, Any], sliced: list[tuple[dict[str, Any], np.ndarray, DataType]]
) -> bytes | bytearray:
    """`header` (the JSON of `document`) with the data of the `sliced` outputs in place of their
    placeholders, written a slice at a time."""
    parts = header.split(_SLICED_JSON)
    if len(parts) != len(sliced) + 1:  # the response's own text holds the placeholder (its id, say)
        for output, array, datatype in sliced:
            output["data"] = array_to_json(array, datatype, output["name"])
        return orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY)
    pieces: list[bytes | bytearray | memoryview] = [parts[0]]
    for (output, array, datatype), after in zip(sliced, parts[1:], strict=True):
        flat = array.reshape(-1)
        pieces.append(b"[")
        for start in range(0, flat.size, JSON_SLICE_ELEMENTS):
            data = array_to_json(flat[start : start + JSON_SLICE_ELEMENTS], datatype, output["name"])
            if start:
                pieces.append(b",")
            pieces.append(memoryview(orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY))[1:-1])
        pieces.append(b"]")
        pieces.append(after)
    return _gathered(pieces)


def _gathered(pieces: Sequence[bytes | bytearray | memoryview]) -> bytearray:
    """The pieces one after the other, copied a slice at a time."""
    gathered = bytearray()
    for piece in pieces:
        view = memoryview(piece).cast("B")
        for start in range(0, view.nbytes, GATHER_BYTES):
            gathered += view[start : start + GATHER_BYTES]
    return gathered


def parse_parameters(value: object, where: str) -> dict[str, ParameterValue]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidArgumentError(f"'parameters' of {where} must be a JSON object")
    for key, item in value.items():
        if not isinstance(item, bool | int | float | str):
            raise InvalidArgumentError(
                f"parameter '{key}' of {where} must be a boolean, number or string, got {type(item).__name__}"
            )
    return value


def _requested_outputs(
    value: object, plan: OutputPlan, class_counts: dict[str, int], regions: SharedMemoryRegions | None
) -> tuple[str, ...] | None:
    """The names of the requested outputs; fills in `plan` and `class_counts` on the way."""
    if value is None or value == []:
        return None
    if not isinstance(value, list):
        raise InvalidArgumentError("'outputs' must be a list of requested outputs")
    names = []
    for item in value:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise InvalidArgumentError("every requested output needs a 'name' string")
        name = item["name"]
        parameters = parse_parameters(item.get("parameters"), f"output '{name}'")
        if REGION in parameters:  # Triton's words, and its order of checks
            for other in (CLASSIFICATION, "binary_data"):
                if parameters.get(other, False) is not False:
                    raise InvalidArgumentError(
                        f"Output can't set both 'shared_memory_region' and '{other}' (output '{name}')"
                    )
        count = parameters.get(CLASSIFICATION)
        if count is not None and not (type(count) is int and count == 0):  # Triton reads 0 as none
            class_counts[name] = parse_class_count(count, name)
        in_shared_memory = shared_memory_reference(parameters, f"output '{name}'")
        if in_shared_memory is not None:
            plan.shared_memory[name] = output_target(regions, in_shared_memory, name)
        # As Triton 2.51 reads it: a listed output is JSON unless it asks for binary data itself;
        # the request's binary_data_output counts where the request lists no outputs.
        binary = parameters.get("binary_data", False)
        if type(binary) is not bool:
            raise InvalidArgumentError(
                "Unable to parse 'binary_data': attempt to access JSON non-boolean as boolean "
                f"(output '{name}')"
            )
        plan.binary[name] = binary
        names.append(name)
    return tuple(names)
