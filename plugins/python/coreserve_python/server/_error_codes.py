"""pb_utils.TritonError codes and coreserve's errors, mapped both ways (server side)."""

from __future__ import annotations

from coreserve import (
    AlreadyExistsError,
    CancelledError,
    CoreserveError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
    UnsupportedError,
)
from coreserve_python.pb_utils import TritonError

# pb_utils.TritonError codes and coreserve's errors: one table, read both ways.
_ERROR_TABLE: tuple[tuple[int, type[CoreserveError]], ...] = (
    (TritonError.INTERNAL, InternalError),
    (TritonError.NOT_FOUND, NotFoundError),
    (TritonError.INVALID_ARG, InvalidArgumentError),
    (TritonError.UNAVAILABLE, UnavailableError),
    (TritonError.UNSUPPORTED, UnsupportedError),
    (TritonError.ALREADY_EXISTS, AlreadyExistsError),
    (TritonError.CANCELLED, CancelledError),
)
ERRORS: dict[int, type[CoreserveError]] = dict(_ERROR_TABLE)
CODES: dict[type[CoreserveError], int] = {error: code for code, error in _ERROR_TABLE}


def error_for(code: int, text: str) -> CoreserveError:
    """The coreserve error for a model's TritonError (UNKNOWN: an error of unknown kind, as
    Triton answers it; a code pb_utils does not define: internal)."""
    if code == TritonError.UNKNOWN:
        return CoreserveError(text)
    return ERRORS.get(code, InternalError)(text)


def code_of(error: CoreserveError) -> int:
    """The TritonError code of a coreserve error (a subclass maps as its parent does; one of
    unknown kind is UNKNOWN)."""
    if type(error) is CoreserveError:
        return TritonError.UNKNOWN
    return next((CODES[cls] for cls in type(error).__mro__ if cls in CODES), TritonError.INTERNAL)
