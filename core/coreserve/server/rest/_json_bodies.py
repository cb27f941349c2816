"""JSON in and out of the REST endpoints: request bodies read as objects, answers written."""

from __future__ import annotations

from typing import Any

import orjson

from coreserve.errors import InvalidArgumentError
from coreserve.server.httpd import HttpResponse


def json_answer(data: Any) -> HttpResponse:
    """A 200 answer carrying `data` as JSON."""
    return HttpResponse(200, orjson.dumps(data), "application/json")


def json_object(body: bytes | bytearray, what: str) -> dict[str, Any]:
    """`body` read as a JSON object; otherwise an InvalidArgumentError naming `what`."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidArgumentError(f"malformed JSON in the {what}: {exc}") from None
    if not isinstance(document, dict):
        raise InvalidArgumentError(f"the {what} must be a JSON object")
    return document
