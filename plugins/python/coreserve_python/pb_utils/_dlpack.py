"""DLPack for `pb_utils.Tensor`: what a producer holds, where, and how a GPU tensor reaches host memory.

Triton's python backend keeps a tensor given to `Tensor.from_dlpack` where it is: a CUDA
tensor stays on its GPU, zero-copy, and `as_numpy()` refuses it. Here a CUDA tensor is held
as its producer (a torch tensor, a CuPy array: anything with `__dlpack__` and
`__dlpack_device__`), so `to_dlpack()` hands out the same device memory again. Only when such a
tensor leaves the stub (a response's output, a BLS request's input) is it copied to host memory
(`host_copy`), because the stub's messages carry host memory: correct, not zero-copy.

Capsules are read with ctypes (a DLManagedTensor, legacy or versioned) without consuming them:
a capsule still named "dltensor" frees its tensor when it is collected, as the protocol says.
The error texts are Triton 2.51's (python_backend/src/pb_tensor.cc, checked against its server).
"""

from __future__ import annotations

import ctypes
import importlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from coreserve_python.ipc import DTYPES  # (BF16: bfloat16 where ml_dtypes is installed)
from coreserve_python.pb_utils._errors import TritonModelException

KDL_CPU = 1
KDL_CUDA = 2
KDL_CUDA_HOST = 3  # pinned host memory: CPU memory to Triton and to numpy
_HOST_DEVICES = (KDL_CPU, KDL_CUDA_HOST)

# Eight spaces inside, as Triton's answer has them (a line continuation in its string literal).
NOT_SUPPORTED_TEXT = (
    "Provided tensor is not supported. Tensor must be a DLPack capsule         "
    "or have `__dlpack__` and `__dlpack_device__` attributes"
)
NOT_CONTIGUOUS_TEXT = (
    "DLPack tensor is not contiguous. "
    "Only contiguous DLPack tensors that are stored in C-Order are supported."
)
GPU_AS_NUMPY_TEXT = "Tensor is stored in GPU and cannot be converted to NumPy."
BF16_AS_NUMPY_TEXT = (
    "Tensor dtype is BF16 and cannot be converted to NumPy. Use to_dlpack() and from_dlpack() instead."
)
KDL_BFLOAT = 4  # DLDataTypeCode of bfloat16, which numpy's DLPack neither exports nor imports
STRING_DLPACK_TEXT = "DLPack does not have support for string tensors."
EMPTY_NAME_TEXT = "Tensor name cannot be an empty string."


def unsupported_device_text(device_type: int) -> str:
    """Triton's text for a DLPack device that is neither the CPU, pinned host memory nor CUDA."""
    return f"DLDevice type {device_type} is not support by Python backend."


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("major", ctypes.c_uint32),
        ("minor", ctypes.c_uint32),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", _DLTensor),
    ]


_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = [ctypes.py_object]
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_LAYOUTS = {b"dltensor": _DLManagedTensor, b"dltensor_versioned": _DLManagedTensorVersioned}
# DLDataTypeCode: 0 int, 1 uint, 2 float, 6 bool (4, bfloat, has no numpy type).
_NUMPY_CODES = {0: "i", 1: "u", 2: "f", 6: "b"}


@dataclass(frozen=True, slots=True)
class DLPackLayout:
    """What a DLPack capsule describes: where its data lies, its shape, strides and element type."""

    device_type: int
    device_id: int
    address: int  # data + byte_offset
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None  # in elements; None: C order
    type_code: int
    bits: int
    lanes: int

    def is_c_contiguous(self) -> bool:
        """Whether the elements lie in C order without gaps (dimensions of 1 have any stride)."""
        if self.strides is None:
            return True
        expected = 1
        for size, stride in zip(reversed(self.shape), reversed(self.strides), strict=True):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True

    def numpy_dtype(self) -> np.dtype[Any] | None:
        """The numpy element type; None for one numpy lacks (bfloat16, vectors)."""
        kind = _NUMPY_CODES.get(self.type_code)
        if kind is None or self.lanes != 1:
            return None
        if kind == "b":
            return np.dtype(np.bool_)
        return np.dtype(f"{kind}{self.bits // 8}")

    def byte_size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * ((self.bits * self.lanes + 7) // 8)


def is_capsule(value: Any) -> bool:
    """Whether `value` is a bare PyCapsule (what `to_dlpack()` functions return)."""
    return type(value).__name__ == "PyCapsule"


def read_capsule(capsule: Any) -> DLPackLayout:
    """The layout a DLPack capsule describes, read without consuming it."""
    name = _capsule_name(capsule)
    structure = _LAYOUTS.get(name or b"")
    if structure is None:
        raise TritonModelException(
            f"not an unused DLPack capsule (its name is {name!r}): a capsule can be consumed only once"
        )
    managed = structure.from_address(_capsule_pointer(capsule, name))
    tensor = managed.dl_tensor
    shape = tuple(tensor.shape[i] for i in range(tensor.ndim))
    strides = tuple(tensor.strides[i] for i in range(tensor.ndim)) if tensor.strides else None
    return DLPackLayout(
        device_type=tensor.device.device_type,
        device_id=tensor.device.device_id,
        address=(tensor.data or 0) + tensor.byte_offset,
        shape=shape,
        strides=strides,
        type_code=tensor.dtype.code,
        bits=tensor.dtype.bits,
        lanes=tensor.dtype.lanes,
    )


class CapsuleProducer:
    """Presents a bare capsule as a producer (`__dlpack__`, `__dlpack_device__`), once."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule
        layout = read_capsule(capsule)
        self._device = (layout.device_type, layout.device_id)

    def __dlpack__(self, stream: Any = None, **_: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._device


def export(producer: Any, stream: Any = None, **options: Any) -> Any:
    """A capsule of `producer`; DLPack 1.0 options are dropped for producers that predate them."""
    if options:
        try:
            return producer.__dlpack__(stream=stream, **options)
        except TypeError:
            pass
    return producer.__dlpack__(stream=stream)


def export_bfloat16(array: np.ndarray, stream: Any = None, **options: Any) -> Any:
    """A capsule of a host bfloat16 array (an ml_dtypes one), typed as DLPack's bfloat16: its
    16-bit words exported by numpy, the element type set before anyone consumed the capsule."""
    capsule = export(array.view(np.uint16), stream, **options)
    name = _capsule_name(capsule)
    managed = _LAYOUTS[name].from_address(_capsule_pointer(capsule, name))
    managed.dl_tensor.dtype.code = KDL_BFLOAT
    return capsule


def _host_bfloat16(producer: Any) -> np.ndarray:
    """A host bfloat16 DLPack tensor as an ml_dtypes array sharing its memory (numpy refuses the
    type); the array keeps the producer and its capsule, whose deleter runs when both go."""
    if "BF16" not in DTYPES:
        raise TritonModelException("a bfloat16 tensor needs the ml_dtypes package in the model's environment")
    capsule = producer.__dlpack__(stream=None)
    layout = read_capsule(capsule)
    if not layout.is_c_contiguous():
        raise TritonModelException(NOT_CONTIGUOUS_TEXT)
    count = int(np.prod(layout.shape, dtype=np.int64))
    words = (ctypes.c_uint16 * count).from_address(layout.address) if count else (ctypes.c_uint16 * 0)()
    words._held = (producer, capsule)  # type: ignore[attr-defined]
    array: np.ndarray = np.frombuffer(memoryview(words), np.uint16).reshape(layout.shape)
    return array.view(DTYPES["BF16"])


@dataclass(frozen=True, slots=True)
class DeviceTensor:
    """A tensor in CUDA memory, held as its producer so its memory stays where it is."""

    producer: Any
    layout: DLPackLayout

    @property
    def device_id(self) -> int:
        return self.layout.device_id


def host_or_device(value: Any) -> np.ndarray | DeviceTensor:
    """What `Tensor.from_dlpack` keeps of a DLPack capsule or producer: a numpy array that shares
    host memory with it, or the CUDA tensor itself; Triton's errors for anything else."""
    if is_capsule(value):
        value = _capsule_owner(value)
    elif not (hasattr(value, "__dlpack__") and hasattr(value, "__dlpack_device__")):
        raise TritonModelException(NOT_SUPPORTED_TEXT)
    device_type = int(value.__dlpack_device__()[0])
    if device_type == KDL_CUDA:
        # stream=None: the producer orders its pending work before the legacy default stream,
        # the stream every later use here (a copy to host) runs on.
        layout = read_capsule(value.__dlpack__(stream=None))
        if not layout.is_c_contiguous():
            raise TritonModelException(NOT_CONTIGUOUS_TEXT)
        return DeviceTensor(value, layout)
    if device_type not in _HOST_DEVICES:
        raise TritonModelException(unsupported_device_text(device_type))
    if is_bfloat16(value):
        return _host_bfloat16(value)
    array = np.from_dlpack(value)
    if not array.flags.c_contiguous:
        raise TritonModelException(NOT_CONTIGUOUS_TEXT)
    return array


def is_bfloat16(producer: Any) -> bool:
    """Whether a host DLPack producer's elements are bfloat16 (read without consuming it)."""
    if isinstance(producer, CapsuleProducer):
        capsule = producer.__dlpack__()
    elif isinstance(producer, np.ndarray):
        return False
    else:
        capsule = producer.__dlpack__(stream=None)
    layout = read_capsule(capsule)
    return layout.type_code == KDL_BFLOAT and layout.bits == 16 and layout.lanes == 1


def _capsule_owner(capsule: Any) -> Any:
    """A producer for a bare capsule: CPU ones are read by numpy; a CUDA capsule needs a
    framework that can own device memory (torch or CuPy), as numpy cannot: the one the model
    has imported (it made the capsule), else whichever imports."""
    producer = CapsuleProducer(capsule)
    if producer.__dlpack_device__()[0] != KDL_CUDA:
        return producer
    frameworks = ("torch", "cupy")
    loaded = [sys.modules[name] for name in frameworks if name in sys.modules]
    for module in loaded or _importable(frameworks):
        return module.from_dlpack(producer)
    raise TritonModelException(
        "a DLPack capsule in GPU memory needs torch or cupy in the model's environment to hold it"
    )


def _importable(names: tuple[str, ...]) -> Iterator[Any]:
    """The modules of `names` that import, in that order."""
    for name in names:
        try:
            yield importlib.import_module(name)
        except ImportError:
            continue


def host_copy(tensor: DeviceTensor) -> np.ndarray:
    """The tensor's elements copied into host memory (a numpy array the caller owns)."""
    dtype = tensor.layout.numpy_dtype()
    if dtype is None:
        raise TritonModelException("a GPU tensor whose element type numpy lacks cannot leave the model")
    try:  # DLPack 1.0: the producer copies to the CPU itself (torch >= 2.9, CuPy >= 13)
        return np.from_dlpack(tensor.producer, device="cpu", copy=True)
    except (BufferError, TypeError, ValueError, NotImplementedError, RuntimeError):
        pass
    return _cuda_runtime_copy(tensor, dtype)


def _cuda_runtime_copy(tensor: DeviceTensor, dtype: np.dtype[Any]) -> np.ndarray:
    """Copies through the CUDA runtime (cuda-python), the way the server copies CUDA shared memory."""
    try:
        from cuda.bindings import runtime
    except ImportError:
        raise TritonModelException(
            "copying a GPU tensor to host memory needs a producer that supports DLPack 1.0 "
            "copies (torch >= 2.9, CuPy >= 13) or cuda-python in the model's environment"
        ) from None
    capsule = tensor.producer.__dlpack__(stream=None)  # kept alive until the copy is done
    layout = read_capsule(capsule)
    host = np.empty(layout.shape, dtype=dtype)
    (error,) = runtime.cudaSetDevice(layout.device_id)
    if error == runtime.cudaError_t.cudaSuccess:
        (error,) = runtime.cudaMemcpy(
            host.ctypes.data, layout.address, host.nbytes, runtime.cudaMemcpyKind.cudaMemcpyDeviceToHost
        )
    if error != runtime.cudaError_t.cudaSuccess:
        raise TritonModelException(f"copying a GPU tensor to host memory failed: {error.name}")
    del capsule
    return host
