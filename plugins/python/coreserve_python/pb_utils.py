"""The API a Triton `model.py` uses: `triton_python_backend_utils`, here under a coreserve name.

Inside a stub process `import triton_python_backend_utils as pb_utils` gives this module.
Standard library and numpy only; calls that need the server (BLS requests, streamed responses,
log lines) go through the stub's runtime, which the stub installs with `_install_runtime`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np

from coreserve_python.pb_errors import TritonError, TritonModelException
from coreserve_python.pb_model_config import ModelConfig
from coreserve_python.pb_types import (
    deserialize_bytes_tensor,
    numpy_to_triton_string,
    numpy_to_triton_type,
    serialize_byte_tensor,
    triton_string_to_numpy,
    triton_to_numpy_type,
)

__all__ = [
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "Logger",
    "ModelConfig",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "deserialize_bytes_tensor",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "numpy_to_triton_string",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
]

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2


class _Runtime(Protocol):
    """What the stub provides to this module."""

    def execute_bls(
        self, request: InferenceRequest, decoupled: bool, timeout: float | None
    ) -> list[InferenceResponse]: ...

    def stream_bls(self, request: InferenceRequest, timeout: float | None) -> Iterator[InferenceResponse]: ...

    async def execute_bls_async(self, request: InferenceRequest, decoupled: bool) -> Any: ...

    def send_response(self, key: int, response: InferenceResponse | None, flags: int) -> None: ...

    def log(self, level: str, message: str) -> None: ...


_runtime: _Runtime | None = None


def _install_runtime(runtime: _Runtime) -> None:
    global _runtime
    _runtime = runtime


def _require_runtime(what: str) -> _Runtime:
    if _runtime is None:
        raise TritonModelException(f"{what} works only inside a model served by coreserve")
    return _runtime


class _DLPackCapsule:
    """Presents a bare DLPack capsule to numpy.from_dlpack (CPU memory only)."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, stream: Any = None, **_: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


class Tensor:
    """A named tensor; its data is a numpy array (BYTES: an object array of bytes)."""

    def __init__(self, name: str, data: np.ndarray) -> None:
        if not isinstance(data, np.ndarray):
            raise TritonModelException(f"tensor '{name}' needs a numpy array, got {type(data).__name__}")
        if data.dtype.kind in "SU":
            data = data.astype(np.object_)
        self._name = name
        self._data = data

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._data

    def shape(self) -> list[int]:
        return list(self._data.shape)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        if self._data.dtype == np.object_:
            raise TritonModelException(f"tensor '{self._name}' holds BYTES, which DLPack cannot carry")
        return self._data.__dlpack__()

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> Tensor:
        source = capsule if hasattr(capsule, "__dlpack__") else _DLPackCapsule(capsule)
        return Tensor(name, np.from_dlpack(source))

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, shape={list(self._data.shape)}, dtype={self._data.dtype})"


class InferenceResponse:
    """A response: output tensors, or an error."""

    def __init__(
        self,
        output_tensors: list[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        self._outputs = list(output_tensors or [])
        self._error = error
        self._parameters: dict[str, Any] = (
            json.loads(parameters) if isinstance(parameters, str) else dict(parameters or {})
        )

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return json.dumps(self._parameters)


class _Cancellation:
    """Whether the server cancelled a request: set by the stub's reader thread, read by the model."""

    __slots__ = ("cancelled",)

    def __init__(self, cancelled: bool = False) -> None:
        self.cancelled = cancelled


class InferenceResponseSender:
    """Sends the responses of a request of a decoupled model, from any thread."""

    def __init__(self, key: int, cancellation: _Cancellation | None = None) -> None:
        self._key = key
        self._closed = False
        self._cancellation = cancellation or _Cancellation()

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if self._closed:
            raise TritonModelException("this request's final response was already sent")
        if response is None and not flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            raise TritonModelException(
                "send() needs a response unless flags has TRITONSERVER_RESPONSE_COMPLETE_FINAL"
            )
        _require_runtime("InferenceResponseSender.send").send_response(self._key, response, flags)
        if flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self._closed = True

    def is_cancelled(self) -> bool:
        """True once the request was cancelled (its client gave up): a model may stop sending."""
        return self._cancellation.cancelled


class InferenceRequest:
    """A request: the ones `execute` receives, or a BLS request to another model of the server."""

    def __init__(
        self,
        model_name: str = "",
        inputs: list[Tensor] | None = None,
        requested_output_names: list[str] | None = None,
        model_version: int = -1,
        correlation_id: int | str = 0,
        parameters: dict[str, Any] | str | None = None,
        flags: int = 0,
        timeout: int = 0,
        request_id: str = "",
        **_: Any,
    ) -> None:
        self._model_name = model_name
        self._inputs = list(inputs or [])
        self._requested = list(requested_output_names or [])
        self._model_version = model_version
        self._correlation_id = correlation_id
        self._parameters: dict[str, Any] = (
            json.loads(parameters) if isinstance(parameters, str) else dict(parameters or {})
        )
        self._flags = flags
        self._timeout = timeout
        self._request_id = request_id
        self._key: int | None = None  # set for requests given to execute
        self._cancellation = _Cancellation()  # shared with the stub, which sets it

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def requested_output_names(self) -> list[str]:
        return self._requested

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def timeout(self) -> int:
        return self._timeout

    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._model_version

    def parameters(self) -> str:
        """The request's parameters as a JSON string (as Triton gives them)."""
        return json.dumps(self._parameters)

    def is_cancelled(self) -> bool:
        """True once the request was cancelled (its client gave up, or its deadline passed)."""
        return self._cancellation.cancelled

    def get_response_sender(self) -> InferenceResponseSender:
        if self._key is None:
            raise TritonModelException("only requests given to execute() have a response sender")
        return InferenceResponseSender(self._key, self._cancellation)

    def exec(self, decoupled: bool = False) -> Any:
        """Runs this request on its model through the server; returns the response, or for
        `decoupled=True` an iterator of the responses."""
        runtime = _require_runtime("InferenceRequest.exec")
        timeout = self._timeout / 1e6 if self._timeout else None
        if decoupled:
            return runtime.stream_bls(self, timeout)
        return runtime.execute_bls(self, False, timeout)[0]

    async def async_exec(self, decoupled: bool = False) -> Any:
        """exec() for `async def execute`: awaitable; decoupled gives an async iterator."""
        return await _require_runtime("InferenceRequest.async_exec").execute_bls_async(self, decoupled)


class Logger:
    """Log lines that appear in the server's log, tagged with the model."""

    INFO, WARNING, ERROR, VERBOSE = "INFO", "WARNING", "ERROR", "VERBOSE"

    @staticmethod
    def log(message: str, level: str = "INFO") -> None:
        if _runtime is None:
            print(f"{level}: {message}", file=sys.stderr)
        else:
            _runtime.log(level, str(message))

    @staticmethod
    def log_info(message: str) -> None:
        Logger.log(message, Logger.INFO)

    @staticmethod
    def log_warn(message: str) -> None:
        Logger.log(message, Logger.WARNING)

    @staticmethod
    def log_error(message: str) -> None:
        Logger.log(message, Logger.ERROR)

    @staticmethod
    def log_verbose(message: str) -> None:
        Logger.log(message, Logger.VERBOSE)


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    return next((tensor for tensor in request.inputs() if tensor.name() == name), None)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    return next((tensor for tensor in response.output_tensors() if tensor.name() == name), None)


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((entry for entry in model_config.get("input", []) if entry.get("name") == name), None)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((entry for entry in model_config.get("output", []) if entry.get("name") == name), None)
