"""The request and response classes of `triton_python_backend_utils`, with its helpers.

`InferenceRequest` (BLS calls included), `InferenceResponse`, the response sender,
`InferenceTrace`, and the module functions Triton defines beside them (`Logger` is in
`_logger`, the BLS response iterator in `_response_iterator`). Calls that need the server go
through the stub: BLS calls and the senders' responses through the `StubCalls` it installs
here (`install_calls`), the rest through its runtime (`_runtime`).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Sequence
from typing import Any, Protocol

import coreserve_python.pb_utils.runtime as _runtime
from coreserve_python.pb_utils._errors import TritonError, TritonModelException
from coreserve_python.pb_utils._response_iterator import ResponseIterator
from coreserve_python.pb_utils._tensor import TRITONSERVER_MEMORY_CPU, PreferredMemory, Tensor, _text

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2


# What Python would iterate where a list of tensors is due (a union would be built on each call).
_NOT_A_LIST = (str, bytes, Tensor)
# Triton's words for a None among a response's outputs.
_EMPTY_OUTPUT_TEXT = "Output tensor for inference response should not be empty."


def _tensor_list(tensors: Any, argument: str, none_text: str) -> list[Tensor]:
    """A list of tensors as Triton's bindings take it: a None in it is a TritonModelException
    (`none_text`), anything else that is not a Tensor (None for the list too) a TypeError."""
    if tensors is None or isinstance(tensors, _NOT_A_LIST):
        raise TypeError(
            f"__init__(): incompatible constructor arguments: {argument} must be a list of Tensor, "
            f"got {type(tensors).__name__}"
        )
    listed = list(tensors)
    for tensor in listed:
        if not isinstance(tensor, Tensor):
            if tensor is None:
                raise TritonModelException(none_text)
            raise TypeError(
                f"__init__(): incompatible constructor arguments: {argument} must be a list of Tensor, "
                f"holding {type(tensor).__name__}"
            )
    return listed


class InferenceTrace:
    """The trace of a request, as Triton's `request.trace()` returns it.

    Given to a BLS request (`InferenceRequest(..., trace=request.trace())`), it makes the BLS
    call a child of that request in the server's trace, when that request is traced.
    """

    def __init__(self, context: str | None = None, _request_key: int | None = None) -> None:
        self._context = context
        self._request_key = _request_key  # the server's key of the request it belongs to

    def get_context(self) -> str | None:
        """The trace's OpenTelemetry context as a JSON string; None when not traced."""
        return self._context


_CPU_MEMORY = PreferredMemory(TRITONSERVER_MEMORY_CPU)
_NOT_TRACED = InferenceTrace()


def _parameters(parameters: dict[str, Any] | str | None) -> dict[str, Any]:
    """Request or response parameters, checked as Triton's bindings check them."""
    if parameters is None:
        return {}
    if isinstance(parameters, str):  # coreserve's own stub passes them decoded already
        parameters = json.loads(parameters)
    if not isinstance(parameters, dict):
        raise TritonModelException(f"parameters must be a dict, found type {type(parameters)}")
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(f"Expect parameters keys to have type str, found type {type(key)}")
        if not isinstance(value, bool | int | str):
            raise TritonModelException(
                f"Expect parameters values to have type bool/int/str, found type {type(value)}"
            )
    return dict(parameters)


class InferenceResponse:
    """A response: output tensors, or an error."""

    def __init__(
        self,
        output_tensors: Sequence[Tensor] = (),
        error: TritonError | None = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        self._outputs = _tensor_list(output_tensors, "output_tensors", _EMPTY_OUTPUT_TEXT)
        self._error = error
        self._parameters = _parameters(parameters)

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return json.dumps(self._parameters, separators=(",", ":"))


class _Cancellation:
    """Whether the server cancelled a request: set by the stub's reader thread, read by the model."""

    __slots__ = ("cancelled",)

    def __init__(self, cancelled: bool = False) -> None:
        self.cancelled = cancelled


_SENDERS_MADE = threading.Lock()


class InferenceResponseSender:
    """Sends the responses of a request, from any thread: any number of them for a decoupled
    model, one for an ordinary model (with the final flag, or followed by it), as on Triton."""

    def __init__(self, key: int, cancellation: _Cancellation | None = None, decoupled: bool = True) -> None:
        self._key = key
        self._decoupled = decoupled
        self._sent = 0
        self._closed = False
        self._lock = threading.RLock()
        self._cancellation = cancellation or _Cancellation()

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if response is None and not flags:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero."
            )
        calls = _require_calls("InferenceResponseSender.send")
        with self._lock:  # (another thread's final flag must not overtake this response)
            self._count(response, flags)
            calls.send_response(self._key, response, flags)

    def _count(self, response: InferenceResponse | None, flags: int) -> None:
        """Takes one response (or the final flag) or refuses it, in Triton's words."""
        with self._lock:
            if not self._decoupled:
                if response is not None and self._sent:
                    raise TritonModelException(
                        "Unable to send response. Non-decoupled model cannot send more than one response."
                    )
                if response is None and flags and not self._sent:
                    raise TritonModelException(
                        "Unable to send response. Non-decoupled model cannot send complete final "
                        "before sending a response."
                    )
            if self._closed:
                raise TritonModelException("Unable to send response. Response sender has been closed.")
            self._closed = bool(flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            self._sent += 1

    def _close(self) -> None:
        """No more responses (the execution failed: the server ended the request)."""
        with self._lock:
            self._closed = True

    def is_cancelled(self) -> bool:
        """True once the request was cancelled (its client gave up): a model may stop sending."""
        return self._cancellation.cancelled


class InferenceRequest:
    """A request: the ones `execute` receives, or a BLS request to another model of the server.

    Arguments are accepted in every form Triton's bindings accept: names as str or bytes (a
    model name read from a BYTES tensor), the correlation ID as int or str, parameters as a
    dict of str to bool, int or str. `timeout` (microseconds) is the server-side request
    timeout, as for a client's request; `preferred_memory` is accepted (outputs reach a
    model in CPU memory here).
    """

    def __init__(
        self,
        request_id: str | bytes = "",
        correlation_id: int | str = 0,
        inputs: list[Tensor] | None = None,
        requested_output_names: list[str | bytes] | None = None,
        model_name: str | bytes | None = None,
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: PreferredMemory | None = None,
        trace: InferenceTrace | None = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        arguments = {
            "request_id": request_id,
            "correlation_id": correlation_id,
            "inputs": inputs,
            "requested_output_names": requested_output_names,
            "model_name": model_name,
            "model_version": model_version,
            "flags": flags,
            "timeout": timeout,
        }
        for argument, value in arguments.items():
            if value is None:  # (Triton's bindings: none of them may be None, the last three required)
                raise TypeError(
                    f"__init__(): incompatible constructor arguments: {argument} is required, not None"
                )
        if not isinstance(correlation_id, int | str):
            raise TritonModelException("Correlation ID must be integer or string")
        self._request_id = _text(request_id, "request_id")
        self._correlation_id = correlation_id
        self._model_name = _text(model_name, "model_name")
        which = f"for request with id '{self._request_id}' and model name '{self._model_name}'"
        self._inputs = _tensor_list(inputs, "inputs", f"Input tensor {which} should not be empty.")
        self._requested = [_text(name, "an output name") for name in requested_output_names]  # type: ignore[union-attr]
        if "" in self._requested:
            raise TritonModelException(f"Requested output name {which} should not be empty.")
        self._model_version = int(model_version)
        self._flags = int(flags)
        self._timeout = int(timeout)
        self._preferred_memory = preferred_memory or _CPU_MEMORY
        self._trace = trace or _NOT_TRACED
        self._parameters = _parameters(parameters)
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        self._key: int | None = None  # set for requests given to execute
        self._cancellation = _Cancellation()  # shared with the stub, which sets it
        self._sender: InferenceResponseSender | None = None
        self._decoupled = False

    @classmethod
    def _served(
        cls,
        key: int,
        model_name: str,
        inputs: list[Tensor],
        requested_output_names: list[str],
        correlation_id: int | str,
        parameters: dict[str, Any],
        flags: int,
        request_id: str,
        cancelled: bool,
        timeout: int = 0,
        decoupled: bool = False,
    ) -> InferenceRequest:
        """A request the server gives to execute(): its values come checked, so none are
        checked again on the request path."""
        request = cls.__new__(cls)
        request._request_id = request_id
        request._correlation_id = correlation_id
        request._inputs = inputs
        request._requested = requested_output_names
        request._model_name = model_name
        request._model_version = -1
        request._flags = flags
        request._timeout = timeout
        request._preferred_memory = _CPU_MEMORY
        request._trace = _NOT_TRACED
        request._parameters = parameters
        request._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        request._key = key
        request._cancellation = _Cancellation(cancelled)
        request._sender = None
        request._decoupled = decoupled
        return request

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def requested_output_names(self) -> set[str]:
        """A set, as Triton's binding gives it (the client's order is not kept there)."""
        return set(self._requested)

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def set_flags(self, flags: int) -> None:
        self._flags = int(flags)

    def timeout(self) -> int:
        return self._timeout

    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._model_version

    def parameters(self) -> str:
        """The request's parameters as a JSON string (as Triton gives them)."""
        return json.dumps(self._parameters, separators=(",", ":"))

    def trace(self) -> InferenceTrace:
        if self._key is not None:  # a request given to execute(): made only when asked for
            return InferenceTrace(None, self._key)
        return self._trace

    def is_cancelled(self) -> bool:
        """True once the request was cancelled (its client gave up, or its deadline passed)."""
        return self._cancellation.cancelled

    def set_release_flags(self, flags: int) -> None:
        """How the request is released when execute() returns: with
        TRITONSERVER_REQUEST_RELEASE_RESCHEDULE it is executed again in a later batch (models
        with `sequence_batching { iterative_sequence: true }`); a non-decoupled model then
        returns None in its place."""
        self._release_flags = int(flags)

    def _rescheduled(self) -> bool:
        return self._release_flags == TRITONSERVER_REQUEST_RELEASE_RESCHEDULE

    def get_response_sender(self) -> InferenceResponseSender:
        if self._key is None:
            raise TritonModelException("only requests given to execute() have a response sender")
        with _SENDERS_MADE:  # (one per request, the same at every call and in every thread)
            if self._sender is None:
                self._sender = InferenceResponseSender(self._key, self._cancellation, self._decoupled)
        return self._sender

    def exec(self, decoupled: bool = False) -> Any:
        """Runs this request on its model through the server: its response, or for
        `decoupled=True` a `ResponseIterator` of its responses."""
        calls = _require_calls("InferenceRequest.exec")
        return calls.stream_bls(self) if decoupled else calls.execute_bls(self)

    def async_exec(self, decoupled: bool = False) -> Any:
        """exec() for `async def execute`: sends the request now and returns an awaitable
        future of its response (of a `ResponseIterator` for `decoupled=True`)."""
        return _require_calls("InferenceRequest.async_exec").async_bls(self, decoupled)


def get_model_dir() -> str:
    """The folder of the model version being served (where its model.py lies)."""
    return _runtime.require("get_model_dir").model_dir()


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    """The request's input tensor named `name`, or None."""
    return next((tensor for tensor in inference_request.inputs() if tensor.name() == name), None)


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    """The response's output tensor named `name`, or None."""
    return next((tensor for tensor in inference_response.output_tensors() if tensor.name() == name), None)


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The configuration of the input named `name`, or None."""
    return next((entry for entry in model_config.get("input", ()) if entry["name"] == name), None)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The configuration of the output named `name`, or None."""
    return next((entry for entry in model_config.get("output", ()) if entry["name"] == name), None)


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    """Whether the configuration makes the model decoupled."""
    if "model_transaction_policy" in model_config:
        return model_config["model_transaction_policy"]["decoupled"]  # type: ignore[no-any-return]
    return False


class StubCalls(Protocol):
    """What requests and response senders ask of the stub (its `ServerRequests`): BLS calls,
    and the responses of a decoupled model's senders."""

    def execute_bls(self, request: InferenceRequest) -> InferenceResponse: ...

    def stream_bls(self, request: InferenceRequest) -> ResponseIterator[InferenceResponse]: ...

    def async_bls(self, request: InferenceRequest, decoupled: bool) -> asyncio.Future[Any]: ...

    def send_response(self, key: int, response: InferenceResponse | None, flags: int) -> None: ...


_calls: StubCalls | None = None


def install_calls(calls: StubCalls) -> None:
    """Installs the stub's calls, with its runtime (`_runtime.install`), before it loads a model."""
    global _calls
    _calls = calls


def _require_calls(what: str) -> StubCalls:
    if _calls is None:
        raise _runtime.not_served(what)
    return _calls
