"""`pb_utils.Tensor`, a named tensor in host memory or in GPU memory, and the memory types.

Host tensors are numpy arrays, as in Triton's python backend; `from_dlpack` shares the memory of
its argument and keeps a CUDA tensor on its GPU (`_dlpack` holds it and copies
it to host memory when it leaves the stub). tests/plugins/python/pb_utils/test_dlpack.py compares the
behaviour and error texts with Triton 2.51's pb_tensor.cc.
"""

from __future__ import annotations

import enum
from typing import Any

import numpy as np

import coreserve_python.pb_utils._dlpack as _dlpack
from coreserve_python.ipc import datatype_of
from coreserve_python.pb_utils._dlpack import DeviceTensor
from coreserve_python.pb_utils._errors import TritonModelException
from coreserve_python.pb_utils._types import numpy_to_triton_type

# TRITONSERVER_DataType numbers by datatype name ("FP32"), for Tensor.triton_dtype().
_DATATYPE_NUMBERS = {
    "BOOL": 1, "UINT8": 2, "UINT16": 3, "UINT32": 4, "UINT64": 5, "INT8": 6, "INT16": 7,
    "INT32": 8, "INT64": 9, "FP16": 10, "FP32": 11, "FP64": 12, "BYTES": 13, "BF16": 14,
}  # fmt: skip


class MemoryType(enum.IntEnum):
    """Where a BLS caller prefers its output tensors (Triton's numbering)."""

    TRITONSERVER_MEMORY_GPU = 0
    TRITONSERVER_MEMORY_CPU = 1


TRITONSERVER_MEMORY_GPU = MemoryType.TRITONSERVER_MEMORY_GPU
TRITONSERVER_MEMORY_CPU = MemoryType.TRITONSERVER_MEMORY_CPU


class PreferredMemory:
    """A BLS request's preferred output memory; outputs reach a model in CPU memory here."""

    def __init__(self, preferred_memory_type: MemoryType | int, preferred_device_id: int = 0) -> None:
        self.preferred_memory_type = MemoryType(preferred_memory_type)
        self.preferred_device_id = int(preferred_device_id)


def _text(value: object, what: str) -> str:
    """A name given as str or as bytes (from a BYTES tensor), as Triton's bindings accept both."""
    if isinstance(value, bytes | bytearray | np.bytes_):
        return bytes(value).decode("utf-8")
    if isinstance(value, str):
        return value
    raise TypeError(f"{what} must be str or bytes, got {type(value).__name__}")


def _tensor_name(name: str | bytes) -> str:
    """A tensor's name as text; Triton refuses an empty one."""
    text = _text(name, "a tensor's name")
    if text == "":
        raise TritonModelException(_dlpack.EMPTY_NAME_TEXT)
    return text


class Tensor:
    """A named tensor: a numpy array in host memory (BYTES: an object array of bytes), or a
    tensor in GPU memory given to `from_dlpack`, kept there (see `_dlpack`)."""

    _device: DeviceTensor | None = None  # set only for tensors in GPU memory

    def __init__(self, name: str | bytes, data: np.ndarray) -> None:
        if not isinstance(data, np.ndarray):  # (a TypeError, as Triton's bindings raise)
            raise TypeError(
                f"__init__(): incompatible constructor arguments: tensor '{name!s}' needs a numpy array, "
                f"got {type(data).__name__}"
            )
        if data.dtype.kind in "SU":  # (Triton refuses str arrays: they are taken as UTF-8 here)
            data = data.astype(np.object_)
        try:
            datatype_of(data)
        except TypeError:  # complex, dates, long doubles, records: no Triton datatype (Triton's words)
            raise TritonModelException("NumPy dtype is not supported.") from None
        self._name = _tensor_name(name)
        self._data = data

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        if self._device is not None:
            raise TritonModelException(_dlpack.GPU_AS_NUMPY_TEXT)
        if self._data.dtype.name == "bfloat16":  # (as on Triton: numpy has no such type)
            raise TritonModelException(_dlpack.BF16_AS_NUMPY_TEXT)
        return self._data

    def shape(self) -> list[int]:
        if self._device is not None:
            return list(self._device.layout.shape)
        return list(self._data.shape)

    def triton_dtype(self) -> int:
        """The tensor's TRITONSERVER_DataType number (FP32: 11, BYTES: 13)."""
        if self._device is not None:
            dtype = self._device.layout.numpy_dtype()
            return 14 if dtype is None else numpy_to_triton_type(dtype)  # type: ignore[return-value]
        return _DATATYPE_NUMBERS[datatype_of(self._data)]

    def is_cpu(self) -> bool:
        """False for a tensor in GPU memory."""
        return self._device is None

    def to_dlpack(self) -> Any:
        """A DLPack capsule of the tensor's memory, on its device (no copy)."""
        return self.__dlpack__()

    def __dlpack__(self, stream: Any = None, **options: Any) -> Any:
        if self._device is not None:
            return _dlpack.export(self._device.producer, stream, **options)
        if self._data.dtype == np.object_:
            raise TritonModelException(_dlpack.STRING_DLPACK_TEXT)
        if self._data.dtype.name == "bfloat16":
            return _dlpack.export_bfloat16(self._data, stream, **options)
        return _dlpack.export(self._data, stream, **options)

    def __dlpack_device__(self) -> tuple[int, int]:
        if self._device is not None:
            return (_dlpack.KDL_CUDA, self._device.device_id)
        return (_dlpack.KDL_CPU, 0)

    def _host_array(self) -> np.ndarray:
        """The elements in host memory, for the stub to send: a GPU tensor is copied here."""
        if self._device is not None:
            return _dlpack.host_copy(self._device)
        return self._data

    @classmethod
    def _wrap(cls, name: str, data: np.ndarray) -> Tensor:
        """A tensor of data the stub decoded (already checked): no checks on the request path."""
        tensor = cls.__new__(cls)
        tensor._name = name
        tensor._data = data
        return tensor

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> Tensor:
        """A tensor sharing the memory of a DLPack capsule or of an object with `__dlpack__`
        (a torch tensor, a numpy or CuPy array): a CUDA tensor stays on its GPU."""
        checked_name = _tensor_name(name)
        held = _dlpack.host_or_device(capsule)
        if isinstance(held, np.ndarray):
            return Tensor(checked_name, held)
        tensor = Tensor.__new__(Tensor)
        tensor._name = checked_name
        tensor._data = None  # type: ignore[assignment]
        tensor._device = held
        return tensor

    def __repr__(self) -> str:
        if self._device is not None:
            dtype, device_id = self._device.layout.numpy_dtype(), self._device.device_id
            return f"Tensor({self._name!r}, shape={self.shape()}, dtype={dtype}, device=cuda:{device_id})"
        return f"Tensor({self._name!r}, shape={list(self._data.shape)}, dtype={self._data.dtype})"
