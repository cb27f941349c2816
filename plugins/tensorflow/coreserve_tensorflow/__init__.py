"""coreserve's TensorFlow backend: `tensorflow`, for SavedModels and GraphDefs."""

from __future__ import annotations

from coreserve.backend import BackendRegistry, hookimpl
from coreserve_tensorflow._backend import TensorFlowBackend

__all__ = ["TensorFlowBackend"]


@hookimpl
def coreserve_register_backends(register: BackendRegistry) -> None:
    register.add(TensorFlowBackend())
