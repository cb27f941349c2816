"""OpenAI's error format: `{"error": {"message", "type", "param", "code"}}`, with its statuses."""

from __future__ import annotations

import logging

import orjson

from coreserve.errors import CoreserveError, ErrorCode, InvalidArgumentError
from coreserve.server.httpd import HttpResponse
from coreserve.server.rest import HTTP_STATUS

logger = logging.getLogger(__name__)
# OpenAI's `type` for each status class it documents; the rest are server errors.
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    499: "cancelled_error",
    501: "not_implemented_error",
    503: "service_unavailable_error",
}


class OptionError(InvalidArgumentError):
    """A request option that is malformed or that the model cannot take; names the option."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


class ModelNotFound(CoreserveError):
    """The model a request names is not served (OpenAI answers 404 with code model_not_found)."""

    code = ErrorCode.NOT_FOUND


def openai_error(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> HttpResponse:
    """An answer in OpenAI's error format; also what the HTTP server sends for framing errors."""
    body = {
        "error": {
            "message": message,
            "type": _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error"),
            "param": param,
            "code": code,
        }
    }
    return HttpResponse(status, orjson.dumps(body), "application/json")


def error_answer(exc: CoreserveError, where: str) -> HttpResponse:
    """The OpenAI-format answer to a domain error; a server fault (5xx) is logged, once, here.

    `where` names the request in that log line.
    """
    if isinstance(exc, ModelNotFound):
        return openai_error(404, exc.message, "model", "model_not_found")
    # A cancelled request keeps a status of its own here (the KServe frontends answer 400, as
    # Triton's): OpenAI clients tell it by its type.
    status = 499 if exc.code is ErrorCode.CANCELLED else HTTP_STATUS[exc.code]
    if status >= 500:
        logger.error("OpenAI frontend: %s failed: %s", where, exc.message)
    param = exc.param if isinstance(exc, OptionError) else None
    return openai_error(status, exc.message, param)
