"""KServe v2 gRPC requests: ModelInferRequest messages → InferenceRequests.

Tensors travel in `raw_input_contents` (what tritonclient sends) or in the typed `contents`
fields. The response side (InferenceResponse → ModelInferResponse) is grpc_response.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from coreserve.errors import InvalidArgumentError, RequestMismatchError, with_request_id
from coreserve.protocol._request_parameters import check_grpc_parameters
from coreserve.protocol._shared_memory import (
    SharedMemoryReference,
    SharedMemoryRegions,
    input_buffer,
    input_from_buffer,
    output_target,
    shared_memory_reference,
)
from coreserve.protocol.classification import PARAMETER as CLASSIFICATION
from coreserve.protocol.classification import parse_class_count
from coreserve.protocol.output_plan import DEFAULT_PLAN, OutputPlan
from coreserve.protocol.tensors import (
    array_from_bytes,
    check_shape,
    element_count,
    parse_datatype,
)
from coreserve.protos import grpc_service_pb2 as pb
from coreserve.types import NUMPY_DTYPES, DataType, InferenceRequest, ParameterValue

# The typed `contents` field that carries each datatype (FP16 and BF16 travel only as raw bytes).
_CONTENTS_FIELD = {
    DataType.BOOL: "bool_contents",
    DataType.INT8: "int_contents",
    DataType.INT16: "int_contents",
    DataType.INT32: "int_contents",
    DataType.INT64: "int64_contents",
    DataType.UINT8: "uint_contents",
    DataType.UINT16: "uint_contents",
    DataType.UINT32: "uint_contents",
    DataType.UINT64: "uint64_contents",
    DataType.FP32: "fp32_contents",
    DataType.FP64: "fp64_contents",
    DataType.BYTES: "bytes_contents",
}
# The type Triton names for data found in each field (when the input is of another type).
_FIELD_TYPES = {
    "bool_contents": "BOOL",
    "int_contents": "INT32",
    "int64_contents": "INT64",
    "uint_contents": "UINT32",
    "uint64_contents": "UINT64",
    "fp32_contents": "FP32",
    "fp64_contents": "FP64",
    "bytes_contents": "BYTES",
}


def parameter_value(parameter: pb.InferParameter) -> ParameterValue:
    choice = parameter.WhichOneof("parameter_choice")
    if choice is None:
        raise InvalidArgumentError("a parameter has no value")
    value: ParameterValue = getattr(parameter, choice)
    return value


def set_parameter(parameter: pb.InferParameter, value: ParameterValue) -> None:
    if isinstance(value, bool):
        parameter.bool_param = value
    elif isinstance(value, int):
        if value >= 2**63:
            parameter.uint64_param = value
        else:
            parameter.int64_param = value
    elif isinstance(value, float):
        parameter.double_param = value
    else:
        parameter.string_param = str(value)


def decode_model_infer_request(
    message: pb.ModelInferRequest,
    regions: SharedMemoryRegions | None = None,
    raw_contents: Sequence[bytes | memoryview] | None = None,
) -> tuple[InferenceRequest, OutputPlan]:
    """Decodes a ModelInferRequest and its output plan (the outputs to write into shared
    memory, resolved now); raw contents are wrapped without copying when aligned.

    Inputs in shared memory (read through `regions`) have no raw_input_contents entry: the
    entries belong, in order, to the other inputs. `raw_contents`, when given, stands for the
    message's raw_input_contents (see parse_model_infer_request).
    """
    raw = message.raw_input_contents if raw_contents is None else raw_contents
    tensors = list(message.inputs)  # (each access to a repeated field makes its wrappers anew)
    names = [tensor.name for tensor in tensors]
    try:
        sources = _input_sources(message, tensors, names, regions, raw)
        inputs = _decode_inputs(message, tensors, names, sources, raw)
    except RequestMismatchError as exc:  # Triton names the request in these
        raise RequestMismatchError(with_request_id(message.id, exc.message)) from None
    parameters: dict[str, ParameterValue] = {}
    given = message.parameters
    if given:
        check_grpc_parameters(given)
        parameters = {key: parameter_value(value) for key, value in given.items()}
        sequence_id = parameters.get("sequence_id")
        if isinstance(sequence_id, int) and sequence_id < 0:  # as Triton, an int64 id read unsigned
            parameters["sequence_id"] = sequence_id + 2**64
    class_counts = {}
    plan = DEFAULT_PLAN
    outputs = list(message.outputs)
    for output in outputs:
        if output.parameters:
            if CLASSIFICATION in output.parameters:
                class_counts[output.name] = _class_count(output.parameters[CLASSIFICATION], output.name)
            reference = shared_memory_reference(_parameters(output.parameters), f"output '{output.name}'")
            if reference is not None:
                if plan is DEFAULT_PLAN:
                    plan = OutputPlan()
                plan.shared_memory[output.name] = output_target(regions, reference, output.name)
    request = InferenceRequest(
        model_name=message.model_name,
        model_version=message.model_version,
        id=message.id,
        inputs=inputs,
        parameters=parameters,
        requested_outputs=tuple(output.name for output in outputs) or None,
        class_counts=class_counts or None,
    )
    return request, plan


# Where an input's data is: its region's reference and bytes, its raw_input_contents entry, or
# (None) its typed contents.
_Source = tuple[SharedMemoryReference, memoryview] | int | None


def _input_sources(
    message: pb.ModelInferRequest,
    tensors: Sequence[pb.ModelInferRequest.InferInputTensor],
    names: Sequence[str],
    regions: SharedMemoryRegions | None,
    raw: Sequence[bytes | memoryview],
) -> list[_Source]:
    """Where each input's data is, found in Triton 2.51's order, so that a request with several
    mistakes gets the error Triton gives it.

    Triton's gRPC frontend first adds every input (a name given twice fails there), then finds
    each input's data in turn: its region, its contents (never beside raw_input_contents), or
    the next raw entry; the first input left without data is named. Datatypes and shapes are
    checked after that, and raw entries beyond the inputs are ignored, as there.
    """
    if len(set(names)) != len(names):
        repeated = next(name for index, name in enumerate(names) if name in names[:index])
        raise RequestMismatchError(f"input '{repeated}' already exists in request")
    sources: list[_Source] = []
    index = 0  # the next raw entry
    for tensor, name in zip(tensors, names, strict=True):
        reference = (
            shared_memory_reference(_parameters(tensor.parameters), f"input '{name}'")
            if tensor.parameters
            else None
        )
        if reference is not None:
            sources.append((reference, input_buffer(regions, reference, name)))
        elif tensor.HasField("contents"):
            if raw:
                raise InvalidArgumentError(
                    "contents field must not be specified when using raw_input_contents for "
                    f"'{name}' for model '{message.model_name}'"
                )
            sources.append(None)
        elif index < len(raw):
            sources.append(index)
            index += 1
        else:
            raise InvalidArgumentError(
                f"unable to find data for input tensor '{name}' for model '{message.model_name}' in request."
            )
    return sources


def _decode_inputs(
    message: pb.ModelInferRequest,
    tensors: Sequence[pb.ModelInferRequest.InferInputTensor],
    names: Sequence[str],
    sources: Sequence[_Source],
    raw: Sequence[bytes | memoryview],
) -> dict[str, np.ndarray]:
    """The input arrays of a ModelInferRequest, from shared memory, raw contents or contents."""
    inputs: dict[str, np.ndarray] = {}
    for tensor, name, source in zip(tensors, names, sources, strict=True):
        datatype = parse_datatype(tensor.datatype, name)
        shape = check_shape(tuple(tensor.shape), name)
        if source is None:
            inputs[name] = _array_from_contents(tensor, datatype, shape, message.model_name)
        elif isinstance(source, int):
            inputs[name] = array_from_bytes(
                memoryview(raw[source]), datatype, shape, name, message.model_name
            )
        else:
            reference, buffer = source
            inputs[name] = input_from_buffer(buffer, reference, datatype, shape, name, message.model_name)
    return inputs


def _class_count(parameter: pb.InferParameter, output_name: str) -> int:
    if parameter.WhichOneof("parameter_choice") != "int64_param":
        raise InvalidArgumentError(
            f"invalid value type for '{CLASSIFICATION}' parameter, expected int64_param "
            f"(output '{output_name}')"
        )
    return parse_class_count(parameter.int64_param, output_name)


def _parameters(parameters: Any) -> dict[str, ParameterValue]:
    return {key: parameter_value(value) for key, value in parameters.items()}


def _array_from_contents(tensor: Any, datatype: DataType, shape: tuple[int, ...], model: str) -> np.ndarray:
    name = tensor.name
    field = _CONTENTS_FIELD.get(datatype)
    if field is None:
        raise InvalidArgumentError(f"input '{name}' is {datatype}: send its data in raw_input_contents")
    for other, other_type in _FIELD_TYPES.items():  # Triton's words for data in another type's field
        if other != field and len(getattr(tensor.contents, other)):
            raise InvalidArgumentError(
                f"unexpected explicit tensor data for input tensor '{name}' for model '{model}' of type "
                f"'{other_type}', expected datatype '{datatype}'"
            )
    values = getattr(tensor.contents, field)
    count = element_count(shape)
    if len(values) != count and datatype is DataType.BYTES:
        raise RequestMismatchError(
            f"expected {count} string elements for inference input '{name}' for model '{model}', "
            f"got {len(values)}"
        )
    if len(values) != count:
        itemsize = NUMPY_DTYPES[datatype].itemsize
        raise RequestMismatchError(  # Triton's words (it counts the bytes), then the elements
            f"input byte size mismatch for input '{name}' for model '{model}'. Expected {count * itemsize}, "
            f"got {len(values) * itemsize} ({len(values)} elements in contents.{field}, its shape "
            f"{list(shape)} needs {count})"
        )
    if datatype is DataType.BYTES:
        array = np.empty(count, dtype=np.object_)
        array[:] = list(values)
        return array.reshape(shape)
    dtype = NUMPY_DTYPES[datatype]
    if dtype.kind in "iu" and count:
        info = np.iinfo(dtype)
        if min(values) < info.min or max(values) > info.max:
            raise InvalidArgumentError(
                f"input '{name}' has values outside the range of {datatype} ({info.min}..{info.max})"
            )
    return np.array(values, dtype=dtype).reshape(shape)
