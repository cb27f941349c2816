"""ONNX Runtime's tensor types as coreserve datatypes, and a model's tensors as coreserve sees them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from coreserve import DataType
from coreserve.backend import ModelTensor

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
