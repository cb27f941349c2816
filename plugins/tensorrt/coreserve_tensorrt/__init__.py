"""coreserve's TensorRT backend (`tensorrt`, platform `tensorrt_plan`).

TensorRT and CUDA are imported only when a model loads, so the plugin registers (and the
server starts) on machines without them.
"""

from __future__ import annotations

from coreserve.backend import BackendRegistry, hookimpl
from coreserve_tensorrt._backend import TensorRTBackend

__all__ = ["TensorRTBackend"]


@hookimpl
def coreserve_register_backends(register: BackendRegistry) -> None:
    register.add(TensorRTBackend())
