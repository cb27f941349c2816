"""The stub's side of `triton_python_backend_utils`: what the module asks of the running stub.

The stub installs its runtime here (`install`: the stub's `ServerRequests`) before it loads a
model; pb_utils' classes reach the server only through this object, so the module stays
importable (for tests, for tools) with no server at all.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

from coreserve_python.pb_utils._errors import TritonModelException

if TYPE_CHECKING:
    from coreserve_python.pb_utils._inference import InferenceRequest, InferenceResponse, ResponseIterator


class Runtime(Protocol):
    """What the stub provides to pb_utils."""

    def execute_bls(self, request: InferenceRequest) -> InferenceResponse: ...

    def stream_bls(self, request: InferenceRequest) -> ResponseIterator: ...

    def async_bls(self, request: InferenceRequest, decoupled: bool) -> asyncio.Future[Any]: ...

    def send_response(self, key: int, response: InferenceResponse | None, flags: int) -> None: ...

    def log(self, level: str, message: str) -> None: ...

    def ask(self, op: str, fields: dict[str, Any], what: str) -> Any:
        """Sends a request to the server and returns its answer; if the server refuses, raises
        a TritonModelException that says `what` failed and why (see `failure`)."""
        ...

    def failure(self, what: str, reason: str) -> str:
        """Triton's text for a request of the model that failed in the server."""
        ...

    def tell(self, op: str, fields: dict[str, Any]) -> None:
        """Sends a message that needs no answer."""
        ...

    def model_dir(self) -> str: ...


_runtime: Runtime | None = None


def install(runtime: Runtime) -> None:
    global _runtime
    _runtime = runtime


def current() -> Runtime | None:
    return _runtime


def require(what: str) -> Runtime:
    """The stub's runtime; a clear TritonModelException outside a served model."""
    if _runtime is None:
        raise TritonModelException(f"{what} works only inside a model served by coreserve")
    return _runtime
