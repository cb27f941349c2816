"""The stub's side of `triton_python_backend_utils`: what the module asks of the running stub.

The stub installs its runtime here (`install`: the stub's `ServerRequests`) before it loads a
model; pb_utils' metrics, model management, logger and `get_model_dir` reach the server only
through this object, so the module stays importable (for tests, for tools) with no server at
all. The BLS calls and the responses of decoupled models, which carry pb_utils' own requests
and responses, are installed beside it in `_inference` (`install_calls`).
"""

from __future__ import annotations

from typing import Any, Protocol

from coreserve_python.pb_utils._errors import TritonModelException


class Runtime(Protocol):
    """What the stub provides to pb_utils: messages to the server, its log, the model's folder."""

    def log(self, level: str, message: str, source: str) -> None:
        """A line of the model's for the server's log; `source`: the model's `file:line` that logs
        ("": the stub's own line)."""
        ...

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

    def free_shared_memory(self) -> int:
        """The bytes of the stub's shared-memory segments that wait, unused, for its next tensors."""
        ...


_runtime: Runtime | None = None


def install(runtime: Runtime) -> None:
    global _runtime
    _runtime = runtime


def current() -> Runtime | None:
    return _runtime


def require(what: str) -> Runtime:
    """The stub's runtime; a clear TritonModelException outside a served model."""
    if _runtime is None:
        raise not_served(what)
    return _runtime


def not_served(what: str) -> TritonModelException:
    """The error of a call that needs the server, made outside a model served by coreserve."""
    return TritonModelException(f"{what} works only inside a model served by coreserve")
