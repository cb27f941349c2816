"""TensorRT and the CUDA runtime, imported when a plan loads, with clear reasons when they cannot be."""

from __future__ import annotations

from typing import Any

from coreserve import DataType, UnavailableError

INSTALL_HINT = "pip install tensorrt cuda-python on a machine with an NVIDIA GPU and its driver"


def import_tensorrt(model_name: str) -> Any:
    try:
        import tensorrt
    except ImportError as exc:
        raise UnavailableError(
            f"model '{model_name}': plugin-tensorrt needs the TensorRT Python package, which is not "
            f"installed ({exc}); {INSTALL_HINT}"
        ) from None
    return tensorrt


def import_cudart(model_name: str) -> Any:
    """The CUDA runtime bindings, checked to find at least one GPU."""
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        try:
            from cuda import cudart  # cuda-python before 12.6
        except ImportError as exc:
            raise UnavailableError(
                f"model '{model_name}': plugin-tensorrt needs the CUDA runtime bindings of cuda-python "
                f"({exc}); {INSTALL_HINT}"
            ) from None
    error, count = cudart.cudaGetDeviceCount()
    if int(error) != 0 or not count:
        raise UnavailableError(
            f"model '{model_name}': TensorRT engines run on NVIDIA GPUs, and CUDA finds none here ({error})"
        )
    return cudart


def check(cudart: Any, result: Any, what: str) -> Any:
    """Unwraps a cuda-python call's (error, value…) result; raises on a CUDA error."""
    error, *values = result if isinstance(result, tuple) else (result,)
    if int(error) != 0:
        raise UnavailableError(f"CUDA {what} failed: {cudart.cudaGetErrorString(error)[1]!r} ({error})")
    return values[0] if len(values) == 1 else values


def datatypes(trt: Any) -> dict[Any, DataType]:
    """TensorRT's element types as coreserve datatypes (those this TensorRT version has)."""
    names = {
        "bool": DataType.BOOL,
        "uint8": DataType.UINT8,
        "int8": DataType.INT8,
        "int32": DataType.INT32,
        "int64": DataType.INT64,
        "float16": DataType.FP16,
        "float32": DataType.FP32,
        "bfloat16": DataType.BF16,
    }
    return {getattr(trt, name): datatype for name, datatype in names.items() if hasattr(trt, name)}
