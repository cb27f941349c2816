"""coreserve: an inference server that speaks Triton's protocols and reads Triton's model repositories.

This module is the public API, together with `coreserve.backend` for backend authors.
What is not exported here or there is internal and may change.
"""

from __future__ import annotations

import importlib.metadata

try:
    __version__ = importlib.metadata.version("core-server")
except importlib.metadata.PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0"

from coreserve.config import ModelConfig, config_from_dict, config_to_dict
from coreserve.errors import (
    AlreadyExistsError,
    CancelledError,
    CoreserveError,
    ErrorCode,
    InternalError,
    InvalidArgumentError,
    ModelConfigError,
    NotFoundError,
    PermissionDeniedError,
    UnavailableError,
    UnsupportedError,
)
from coreserve.types import DataType, InferenceRequest, InferenceResponse

__all__ = [
    "AlreadyExistsError",
    "CancelledError",
    "CoreserveError",
    "DataType",
    "ErrorCode",
    "InferenceRequest",
    "InferenceResponse",
    "InternalError",
    "InvalidArgumentError",
    "ModelConfig",
    "ModelConfigError",
    "NotFoundError",
    "PermissionDeniedError",
    "UnavailableError",
    "UnsupportedError",
    "__version__",
    "config_from_dict",
    "config_to_dict",
]
