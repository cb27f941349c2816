"""`import c_python_backend_utils`, as some Triton model.py files do, inside coreserve's stubs.

Triton's stub defines its classes in this C++ module and copies most of them into
`triton_python_backend_utils`; models import it to name them (`c_utils.InferenceRequest` in type
hints, `c_utils.Tensor(...)`). Here both modules give the same classes, coreserve_python.pb_utils'.
"""

from coreserve_python.pb_utils import (
    InferenceRequest,
    InferenceResponse,
    InferenceResponseSender,
    InferenceTrace,
    Logger,
    MemoryType,
    Metric,
    MetricFamily,
    MetricKind,
    PreferredMemory,
    ResponseIterator,
    Tensor,
    TritonError,
    TritonModelException,
    is_model_ready,
    load_model,
    unload_model,
)
from coreserve_python.pb_utils import runtime as _runtime

__all__ = [
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "InferenceTrace",
    "Logger",
    "MemoryType",
    "Metric",
    "MetricFamily",
    "MetricKind",
    "PreferredMemory",
    "ResponseIterator",
    "SharedMemory",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "is_model_ready",
    "load_model",
    "shared_memory",
    "unload_model",
]


class SharedMemory:
    """The stub's shared memory (Triton's, for its own tests: not part of its public API)."""

    def free_memory(self) -> int:
        """The bytes of the stub's segments that wait, unused, for its next tensors. (Triton's stub
        has one region of fixed size; coreserve's has segments it makes as tensors need them.)"""
        return _runtime.require("shared_memory.free_memory()").free_shared_memory()


shared_memory = SharedMemory()
