"""TensorRT and the CUDA runtime, imported when a plan loads, with clear reasons when they cannot be."""

from __future__ import annotations

from typing import Any

from coreserve import DataType, UnavailableError

INSTALL_HINT = "pip install tensorrt cuda-python on a machine with an NVIDIA GPU and its driver"


def import_tensorrt(model_name: str = "") -> Any:
    """The tensorrt module; raises UnavailableError saying what is missing (naming the model, if given)."""
    try:
        import tensorrt
    except ImportError as exc:
        raise UnavailableError(
            f"{_model(model_name)}plugin-tensorrt needs the TensorRT Python package, which is not "
            f"installed ({exc}); {INSTALL_HINT}"
        ) from None
    return tensorrt


def _runtime_bindings(model_name: str) -> Any:
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        try:
            from cuda import cudart  # cuda-python before 12.6
        except ImportError as exc:
            raise UnavailableError(
                f"{_model(model_name)}plugin-tensorrt needs the CUDA runtime bindings of cuda-python "
                f"({exc}); {INSTALL_HINT}"
            ) from None
    return cudart


def import_cudart(model_name: str) -> Any:
    """The CUDA runtime bindings, checked to find at least one GPU."""
    cudart = _runtime_bindings(model_name)
    error, count = cudart.cudaGetDeviceCount()
    if int(error) != 0 or not count:
        raise UnavailableError(
            f"model '{model_name}': TensorRT engines run on NVIDIA GPUs, and CUDA finds none here ({error})"
        )
    return cudart


def visible_gpus() -> range:
    """The ids of the GPUs CUDA sees (none when it finds no device); raises UnavailableError
    saying what is missing when TensorRT or the CUDA bindings are not installed."""
    import_tensorrt()
    error, count = _runtime_bindings("").cudaGetDeviceCount()
    return range(count if int(error) == 0 else 0)


def _model(name: str) -> str:
    return f"model '{name}': " if name else ""


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
