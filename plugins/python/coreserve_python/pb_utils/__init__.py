"""The API a Triton `model.py` uses: `triton_python_backend_utils`, here under a coreserve name.

Inside a stub process `import triton_python_backend_utils as pb_utils` gives this module (the
stub puts `coreserve_python/shim/` on sys.path). It offers every name Triton 2.51's module
offers (its Python file and what its stub adds from `c_python_backend_utils`), with the same
arguments and answers; tests/plugins/python/pb_utils/test_utils_triton.py checks that name by name.

What this package may import: the standard library, numpy and `coreserve_python.ipc` (the
datatype table), never coreserve nor the plugin's server side, so that a stub runs in another
Python environment and the module imports with no server at all. Its modules are private;
calls that need the server go through the stub's runtime (`_runtime`), where the stub
(`coreserve_python.stub`) installs itself before it loads a model.
"""

from __future__ import annotations

import json  # noqa: F401  (a module attribute of Triton's pb_utils too)
import struct  # noqa: F401  (a module attribute of Triton's pb_utils too)

from coreserve_python.pb_utils._errors import TritonError, TritonModelException
from coreserve_python.pb_utils._logger import Logger
from coreserve_python.pb_utils._management import is_model_ready, load_model, unload_model
from coreserve_python.pb_utils._metrics import Metric as Metric  # (c_python_backend_utils names:
from coreserve_python.pb_utils._metrics import MetricFamily
from coreserve_python.pb_utils._metrics import MetricKind as MetricKind  # see shim/, not Triton's pb_utils)
from coreserve_python.pb_utils._model_config import ModelConfig
from coreserve_python.pb_utils._response_iterator import ResponseIterator
from coreserve_python.pb_utils._tensor import (
    _DATATYPE_NUMBERS as _DATATYPE_NUMBERS,  # a name of pb_utils for tests
)
from coreserve_python.pb_utils._tensor import (
    TRITONSERVER_MEMORY_CPU,
    TRITONSERVER_MEMORY_GPU,
    MemoryType,
    PreferredMemory,
    Tensor,
)
from coreserve_python.pb_utils._types import (
    TRITON_STRING_TO_NUMPY,
    deserialize_bytes_tensor,
    numpy_to_triton_string,
    numpy_to_triton_type,
    serialize_byte_tensor,
    triton_string_to_numpy,
    triton_to_numpy_type,
)
from coreserve_python.pb_utils.inference import (
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
    TRITONSERVER_REQUEST_RELEASE_ALL,
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    InferenceRequest,
    InferenceResponse,
    InferenceResponseSender,
    InferenceTrace,
    get_input_config_by_name,
    get_input_tensor_by_name,
    get_model_dir,
    get_output_config_by_name,
    get_output_tensor_by_name,
    using_decoupled_model_transaction_policy,
)
from coreserve_python.pb_utils.inference import (
    _Cancellation as _Cancellation,  # the stub's handle on a request's cancellation
)

__all__ = [
    "TRITONSERVER_MEMORY_CPU",
    "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "TRITON_STRING_TO_NUMPY",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "InferenceTrace",
    "Logger",
    "MemoryType",
    "MetricFamily",
    "ModelConfig",
    "PreferredMemory",
    "ResponseIterator",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "deserialize_bytes_tensor",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_model_dir",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "is_model_ready",
    "load_model",
    "numpy_to_triton_string",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "unload_model",
    "using_decoupled_model_transaction_policy",
]
