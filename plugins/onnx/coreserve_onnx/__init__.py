"""coreserve's ONNX Runtime backend (`onnxruntime`, platform `onnxruntime_onnx`)."""

from __future__ import annotations

from coreserve.backend import BackendRegistry, hookimpl
from coreserve_onnx._backend import OnnxBackend

__all__ = ["OnnxBackend"]


@hookimpl
def coreserve_register_backends(register: BackendRegistry) -> None:
    register.add(OnnxBackend())
