"""Plain HTTP requests for bodies that tritonclient would never send (malformed on purpose)."""

from __future__ import annotations

import http.client
import json
from typing import Any


def request(
    address: str, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    host, port = address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def post_json(
    address: str, path: str, document: Any, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    status, _, body = request(address, "POST", path, json.dumps(document).encode(), headers)
    return status, json.loads(body) if body else None


def error_of(address: str, path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """POSTs a body and returns (status, the 'error' message of the JSON reply)."""
    status, _, reply = request(address, "POST", path, body, headers)
    return status, json.loads(reply).get("error", "")
