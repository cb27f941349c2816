"""ONNX Runtime's tensor types as coreserve datatypes, and a model's tensors as coreserve sees them."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from coreserve import DataType, ModelConfigError
from coreserve.backend import ModelSignature, ModelTensor, TensorSpec

ORT_TYPES = {
    "tensor(bool)": DataType.BOOL,
    "tensor(uint8)": DataType.UINT8,
    "tensor(uint16)": DataType.UINT16,
    "tensor(uint32)": DataType.UINT32,
    "tensor(uint64)": DataType.UINT64,
    "tensor(int8)": DataType.INT8,
    "tensor(int16)": DataType.INT16,
    "tensor(int32)": DataType.INT32,
    "tensor(int64)": DataType.INT64,
    "tensor(float16)": DataType.FP16,
    "tensor(float)": DataType.FP32,
    "tensor(double)": DataType.FP64,
    "tensor(string)": DataType.BYTES,
    "tensor(bfloat16)": DataType.BF16,
}
FRAMEWORK = "the ONNX model"


def describe(node_args: Sequence[Any]) -> dict[str, ModelTensor]:
    """onnxruntime's NodeArg list as ModelTensors; symbolic or unknown dims become -1."""
    tensors = {}
    for arg in node_args:
        dims = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in (arg.shape or []))
        tensors[arg.name] = ModelTensor(arg.name, ORT_TYPES.get(arg.type), dims, arg.type)
    return tensors


def scalars(
    signature: ModelSignature, specs: Mapping[str, TensorSpec], tensors: Mapping[str, ModelTensor]
) -> dict[str, tuple[int, ...]]:
    """As Triton's onnxruntime backend: the tensors the model declares with no dimensions (a
    scalar, or a rank onnxruntime does not know) that the configuration gives dims of 1 only,
    with those dims. Triton refuses other dims there in the words used here; batching keeps
    the usual check (its first dimension must be dynamic)."""
    found = {}
    for name, spec in specs.items():
        tensor = tensors.get(name)
        if signature.batching or tensor is None or tensor.dims:
            continue
        dims = tuple(spec.reshape if spec.reshape is not None else spec.dims)
        if any(dim != 1 for dim in dims):
            raise ModelConfigError(
                f"unable to load model '{signature.model_name}', scalar tensor '{name}', should only "
                "provide 1 in the model configuration when the model doesn't support batching. Model "
                f"configuration provided: {list(dims)}."
            )
        found[name] = dims
    return found


def with_dims(
    tensors: Mapping[str, ModelTensor], dims: Mapping[str, tuple[int, ...]]
) -> dict[str, ModelTensor]:
    """`tensors`, those named in `dims` with those dims."""
    return {
        name: dataclasses.replace(tensor, dims=dims[name]) if name in dims else tensor
        for name, tensor in tensors.items()
    }
