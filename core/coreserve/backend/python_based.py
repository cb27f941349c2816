"""Triton's Python-based backends: a backend that is only a `model.py`, in a folder of its own
under the backend directory (`--backend-directory`, Triton's default `/opt/tritonserver/backends`),
which every model naming that backend runs (vLLM's Triton backend is one).

As in Triton, a model's backend is Python-based when its configuration says `runtime:
"model.py"`, or when no installed backend has its name and `<backend-directory>/<backend>/model.py`
exists. The backend named "python" serves it, with that file as the model's code, and the
configuration reads `runtime: "model.py"`; a `pb_exec_env_model.py.tar.gz` beside the file is the
model's EXECUTION_ENV_PATH unless the model names one.
"""

from __future__ import annotations

from pathlib import Path

from coreserve.errors import InvalidArgumentError
from coreserve.protos.model_config_pb2 import ModelConfig

__all__ = ["DEFAULT_BACKEND_DIRECTORY", "PYTHON_BACKEND", "PYTHON_RUNTIME", "python_based_runtime"]

DEFAULT_BACKEND_DIRECTORY = Path("/opt/tritonserver/backends")
PYTHON_BACKEND = "python"  # the backend that serves them
PYTHON_RUNTIME = "model.py"
_ENVIRONMENT = "pb_exec_env_model.py.tar.gz"


def python_based_runtime(config: ModelConfig, backend_directory: Path | None, installed: bool) -> Path | None:
    """The `model.py` the configuration's backend is, when it is a Python-based backend; None
    when it is not. `installed`: whether an installed backend has the configuration's backend
    name (which then serves it, unless the configuration names the runtime). Completes the
    configuration as Triton does. Raises InvalidArgumentError for a runtime that is missing."""
    name = config.backend
    if not name or name == PYTHON_BACKEND or backend_directory is None:
        return None
    runtime = backend_directory / name / PYTHON_RUNTIME
    if config.runtime != PYTHON_RUNTIME:
        if installed or config.runtime or not runtime.is_file():
            return None
        config.runtime = PYTHON_RUNTIME
    elif not runtime.is_file():  # (Triton's words)
        raise InvalidArgumentError(
            f"unable to find Python backend based backend library '{PYTHON_RUNTIME}' for model "
            f"'{config.name}', searched: '{runtime}'"
        )
    environment = runtime.parent / _ENVIRONMENT
    if "EXECUTION_ENV_PATH" not in config.parameters and environment.is_file():
        config.parameters["EXECUTION_ENV_PATH"].string_value = str(environment)
    return runtime
