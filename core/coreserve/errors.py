"""Domain errors of coreserve, independent of any transport.

    CoreserveError                 every error a client or a backend may see
     ├── InvalidArgumentError      the request or a configuration is wrong (names, types, shapes, bodies)
     │    ├── ModelConfigError     a model's configuration is invalid
     │    ├── AmbiguousModelError  a name several repositories hold (--model-namespacing)
     │    └── RequestMismatchError a request's tensors do not fit its model (Triton names the request)
     ├── NotFoundError             no such model or version
     ├── UnavailableError          the model exists but cannot serve now (not ready, queue full)
     ├── UnsupportedError          a feature coreserve or the backend does not offer
     ├── AlreadyExistsError        the thing to create exists already
     ├── CancelledError            the request was cancelled
     ├── PermissionDeniedError     a restricted API was called without its header
     └── InternalError             a fault in a backend or in the server

Each class carries an `ErrorCode`, the same categories as Triton's `TRITONSERVER_Error_Code`.
The frontends map codes to HTTP statuses and gRPC codes, one table each; nothing here knows
about either transport.
"""

from __future__ import annotations

import enum
from typing import Any


class ErrorCode(enum.Enum):
    """The category of an error; frontends choose a status code from it."""

    UNKNOWN = "UNKNOWN"
    INTERNAL = "INTERNAL"
    NOT_FOUND = "NOT_FOUND"
    INVALID_ARG = "INVALID_ARG"
    UNAVAILABLE = "UNAVAILABLE"
    UNSUPPORTED = "UNSUPPORTED"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    CANCELLED = "CANCELLED"
    PERMISSION_DENIED = "PERMISSION_DENIED"


class CoreserveError(Exception):
    """Base class of every error whose message is meant for the client."""

    code: ErrorCode = ErrorCode.UNKNOWN

    @property
    def message(self) -> str:
        """The text for the client, always encodable as UTF-8: a lone surrogate (a client's JSON
        may escape one, `"\\ud800"`, and an error may quote it) is written as its escape."""
        text = str(self.args[0]) if self.args else self.__class__.__name__
        return text if text.isascii() else text.encode("utf-8", "backslashreplace").decode("utf-8")


class InvalidArgumentError(CoreserveError):
    code = ErrorCode.INVALID_ARG


class ModelConfigError(InvalidArgumentError):
    """A model's configuration is invalid; the message names the model and the field."""


class AmbiguousModelError(InvalidArgumentError):
    """A name several repositories hold (--model-namespacing): which model is meant is unknown."""


class RequestMismatchError(InvalidArgumentError):
    """A request's tensors do not fit the model: their count, datatypes, shapes, sizes, batch size.

    Triton finds these once the request exists and puts its id first (`with_request_id`); the
    place that knows the request adds it, so a model's warmup samples read without it.
    """


class NotFoundError(CoreserveError):
    code = ErrorCode.NOT_FOUND


class UnavailableError(CoreserveError):
    code = ErrorCode.UNAVAILABLE


class UnsupportedError(CoreserveError):
    code = ErrorCode.UNSUPPORTED


class AlreadyExistsError(CoreserveError):
    code = ErrorCode.ALREADY_EXISTS


class CancelledError(CoreserveError):
    code = ErrorCode.CANCELLED

    @classmethod
    def of_request(cls, model_name: str) -> CancelledError:
        """What a request gets that its client cancelled before a model ran it."""
        return cls(f"request for model '{model_name}' was cancelled")


class PermissionDeniedError(CoreserveError):
    code = ErrorCode.PERMISSION_DENIED


class InternalError(CoreserveError):
    code = ErrorCode.INTERNAL


def clipped(text: str, limit: int = 100) -> str:
    """`text` cut short for an error message, so that a client's huge value is not echoed whole."""
    return text if len(text) <= limit else text[:limit] + "…"


def quoted_value(value: Any) -> str:
    """A value as an error message quotes it: JSON's spelling, cut short."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f"'{clipped(value)}'"
    return clipped(repr(value))


def with_request_id(request_id: str, message: str) -> str:
    """`message` as Triton words an error of one request: `[request id: ID] message`."""
    return f"[request id: {request_id or '<id_unknown>'}] {message}"
