"""ONNX Runtime's tensor types as coreserve datatypes, and the model's I/O as onnxruntime reports it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from coreserve import DataType

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


@dataclass(frozen=True)
class OnnxTensor:
    """An input or output of an ONNX model: dims are -1 where the model leaves them open."""

    name: str
    ort_type: str
    dims: tuple[int, ...]

    @property
    def datatype(self) -> DataType | None:
        return ORT_TYPES.get(self.ort_type)


def describe(node_args: Sequence[Any]) -> dict[str, OnnxTensor]:
    """onnxruntime's NodeArg list as OnnxTensors; symbolic or unknown dims become -1."""
    tensors = {}
    for arg in node_args:
        dims = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in (arg.shape or []))
        tensors[arg.name] = OnnxTensor(arg.name, arg.type, dims)
    return tensors
