"""coreserve: an inference server that speaks Triton's protocols and reads Triton's model repositories.

This module is the public API, together with `coreserve.backend` for backend authors.
What is not exported here or there is internal and may change.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

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
from coreserve.version import __version__

if TYPE_CHECKING:  # what __getattr__ below imports on first use
    from coreserve.inprocess import Model, Server
    from coreserve.server import ServerOptions, StartupError

# The in-process API brings the whole server (frontends included) with it: imported on first
# use, so that a plugin importing `coreserve` for its backend API does not pay for it.
_IN_PROCESS = {
    "Model": "coreserve.inprocess",
    "Server": "coreserve.inprocess",
    "ServerOptions": "coreserve.server",
    "StartupError": "coreserve.server",
}


def __getattr__(name: str) -> object:
    module = _IN_PROCESS.get(name)
    if module is None:
        raise AttributeError(f"module 'coreserve' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


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
    "Model",
    "ModelConfig",
    "ModelConfigError",
    "NotFoundError",
    "PermissionDeniedError",
    "Server",
    "ServerOptions",
    "StartupError",
    "UnavailableError",
    "UnsupportedError",
    "__version__",
    "config_from_dict",
    "config_to_dict",
]
