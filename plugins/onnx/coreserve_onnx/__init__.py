"""coreserve's ONNX Runtime backend (`onnxruntime`, platform `onnxruntime_onnx`)."""

from __future__ import annotations

import os

from coreserve.backend import BackendRegistry, hookimpl
from coreserve_onnx._backend import OnnxBackend

__all__ = ["OnnxBackend"]

# ONNX Runtime's PyPI builds send usage telemetry from Linux too, and keep a device id, an event
# store (in ~/.cache) and a session file (in the temp folder) for it; Triton's ONNX Runtime
# backend, built without telemetry, sends none. Read once, before onnxruntime's first session:
# an operator's own setting of it stands. Stubs of the Python backend inherit it.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")


@hookimpl
def coreserve_register_backends(register: BackendRegistry) -> None:
    register.add(OnnxBackend())
