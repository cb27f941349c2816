"""The HTTP server's messages: a request as handlers get it, and the answers they give."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field


@dataclass(slots=True)
class HttpRequest:
    method: str
    path: str
    headers: dict[str, str]  # names in lower case
    body: bytes | bytearray  # a bytearray when it came in several pieces
    match_info: dict[str, str] = field(default_factory=dict)
    # Set by a handler whose work should stop if the client goes away before its answer is
    # sent (an inference: it cancels the request); called once, on the event loop. A client
    # that left before the handler set it leaves `disconnected` true instead.
    on_disconnect: Callable[[], object] | None = None
    disconnected: bool = False


@dataclass(slots=True)
class HttpResponse:
    status: int = 200
    body: bytes | bytearray = b""
    content_type: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    compress: bool = False  # compress the body when the request's Accept-Encoding allows


@dataclass(slots=True)
class StreamedResponse:
    """A response whose body is written chunk by chunk as `chunks` yields them."""

    chunks: AsyncIterator[bytes]
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)


Response = HttpResponse | StreamedResponse
Handler = Callable[[HttpRequest], Awaitable[Response]]
ErrorResponse = Callable[[int, str], HttpResponse]
