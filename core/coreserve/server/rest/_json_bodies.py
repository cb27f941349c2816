"""JSON in and out of the REST endpoints: request bodies read as objects, answers written.

The bodies read here (repository, log, trace and shared-memory requests) are read on the event
loop: JSON of millions of small values would hold it (and every other client) for seconds and
take gigabytes as Python objects. So a body is refused before it is read where it could hold
more than MAX_VALUES values (its commas, brackets and braces, counted at C speed: an upper
bound, as a string may hold them too); such requests hold a few dozen. Inference bodies take
another way (`_json_workers`)."""

from __future__ import annotations

from typing import Any

import orjson

from coreserve.errors import InvalidArgumentError
from coreserve.protocol.tensors import json_loads
from coreserve.server.httpd import HttpResponse

MAX_VALUES = 100_000


def json_answer(data: Any) -> HttpResponse:
    """A 200 answer carrying `data` as JSON."""
    return HttpResponse(200, orjson.dumps(data), "application/json")


def json_object(body: bytes | bytearray, what: str) -> dict[str, Any]:
    """`body` read as a JSON object; otherwise an InvalidArgumentError naming `what`."""
    bound = body.count(b",") + body.count(b"[") + body.count(b"{")
    if bound > MAX_VALUES:
        raise InvalidArgumentError(
            f"too many JSON values in the {what} to read it: up to {bound} (its commas, brackets and "
            f"braces); at most {MAX_VALUES}"
        )
    try:
        document = json_loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidArgumentError(f"malformed JSON in the {what}: {exc}") from None
    if not isinstance(document, dict):
        raise InvalidArgumentError(f"the {what} must be a JSON object")
    return document
