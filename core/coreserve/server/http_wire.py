"""A lean HTTP/1.1 server on asyncio and httptools (the C parser uvicorn uses).

The data plane's HTTP path is short, so the web framework around it was most of a request's
CPU time; this module does only what the v2 API needs: keep-alive, pipelined requests
answered in order, Content-Length and chunked request bodies, gzip and deflate request
bodies, `Expect: 100-continue`, a body size limit (413), compressed responses on request,
and streamed (chunked) responses for server-sent events.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus

import httptools

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class HttpRequest:
    method: str
    path: str
    headers: dict[str, str]  # names in lower case
    body: bytes
    match_info: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class HttpResponse:
    status: int = 200
    body: bytes = b""
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


class BodyTooLarge(Exception):
    pass


class _Message:
    """A request being parsed."""

    __slots__ = ("body", "headers", "method", "size", "too_large", "url")

    def __init__(self) -> None:
        self.url = b""
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.size = 0
        self.too_large = False
        self.method = ""


class HttpProtocol(asyncio.Protocol):
    """One client connection: parses requests and answers them one at a time, in order."""

    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._message = _Message()
        self._pending: deque[tuple[HttpRequest | int, bool]] = deque()
        self._worker: asyncio.Task[None] | None = None
        self._writable: asyncio.Future[None] | None = None
        self._closed = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport
        self._server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._server.connections.discard(self)
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._reject(HTTPStatus.NOT_IMPLEMENTED, "protocol upgrades are not supported")
        except httptools.HttpParserError as exc:
            self._reject(HTTPStatus.BAD_REQUEST, f"malformed HTTP request: {exc}")

    def pause_writing(self) -> None:
        if self._writable is None or self._writable.done():
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    # httptools callbacks

    def on_message_begin(self) -> None:
        self._message = _Message()

    def on_url(self, url: bytes) -> None:
        self._message.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        headers = self._message.headers
        headers[key] = f"{headers[key]}, {text}" if key in headers else text

    def on_headers_complete(self) -> None:
        message = self._message
        message.method = self._parser.get_method().decode("ascii")
        length = message.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self._server.max_body_size:
            message.too_large = True
        elif message.headers.get("expect", "").lower() == "100-continue" and self._transport is not None:
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        message = self._message
        if message.too_large:
            return
        message.size += len(body)
        if message.size > self._server.max_body_size:
            message.too_large = True
            message.body.clear()
            return
        message.body.append(body)

    def on_message_complete(self) -> None:
        message = self._message
        keep_alive = self._parser.should_keep_alive() and not message.too_large
        if message.too_large:
            self._pending.append((HTTPStatus.REQUEST_ENTITY_TOO_LARGE, False))
        else:
            path, _, _ = message.url.decode("latin-1").partition("?")
            body = message.body[0] if len(message.body) == 1 else b"".join(message.body)
            self._pending.append((HttpRequest(message.method, path, message.headers, body), keep_alive))
        if len(self._pending) > 16 and self._transport is not None:
            self._transport.pause_reading()  # a client pipelining far ahead waits for answers
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._answer())

    # answering

    async def _answer(self) -> None:
        while self._pending and not self._closed:
            item, keep_alive = self._pending.popleft()
            self._server.busy += 1
            try:
                if isinstance(item, int):
                    limit = self._server.max_body_size
                    await self._send(
                        self._server.error_response(
                            item, f"request body too large: the limit is {limit} bytes"
                        ),
                        {},
                        keep_alive,
                    )
                else:
                    await self._send(await self._server.handle(item), item.headers, keep_alive)
            except Exception:
                logger.exception("HTTP request failed")
                keep_alive = False
                await self._send(self._server.error_response(500, "internal server error"), {}, False)
            finally:
                self._server.busy -= 1
                self._server.answered()
            if not keep_alive:
                self._close()
                return
            if self._transport is not None and len(self._pending) <= 16:
                self._transport.resume_reading()

    async def _send(self, response: Response, request_headers: dict[str, str], keep_alive: bool) -> None:
        if self._closed or self._transport is None:
            return
        connection = b"" if keep_alive else b"Connection: close\r\n"
        if isinstance(response, StreamedResponse):
            await self._send_streamed(response, connection)
            return
        body = response.body
        extra = "".join(f"{name}: {value}\r\n" for name, value in response.headers.items())
        accept = request_headers.get("accept-encoding") if response.compress and body else None
        if accept:
            encoding = _accepted_encoding(accept)
            if encoding is not None:
                body = _compress(body, encoding)
                extra += f"Content-Encoding: {encoding}\r\n"
        if response.content_type is not None:
            extra += f"Content-Type: {response.content_type}\r\n"
        head = (
            f"HTTP/1.1 {response.status} {_reason(response.status)}\r\nContent-Length: {len(body)}\r\n{extra}"
        )
        self._transport.write(head.encode("latin-1") + connection + b"\r\n" + body)
        await self._drained()

    async def _send_streamed(self, response: StreamedResponse, connection: bytes) -> None:
        assert self._transport is not None
        extra = "".join(f"{name}: {value}\r\n" for name, value in response.headers.items())
        head = (
            f"HTTP/1.1 {response.status} {_reason(response.status)}\r\nTransfer-Encoding: chunked\r\n{extra}"
        )
        self._transport.write(head.encode("latin-1") + connection + b"\r\n")
        async for chunk in response.chunks:
            if self._closed:
                return
            if chunk:
                self._transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
                await self._drained()
        if not self._closed:
            self._transport.write(b"0\r\n\r\n")

    async def _drained(self) -> None:
        if self._writable is not None and not self._writable.done():
            await self._writable

    def _reject(self, status: int, message: str) -> None:
        if self._transport is None or self._closed:
            return
        response = self._server.error_response(status, message)
        head = (
            f"HTTP/1.1 {status} {_reason(status)}\r\nContent-Length: {len(response.body)}\r\n"
            f"Content-Type: {response.content_type}\r\nConnection: close\r\n\r\n"
        )
        self._transport.write(head.encode("latin-1") + response.body)
        self._close()

    def _close(self) -> None:
        if self._transport is not None and not self._closed:
            self._closed = True
            self._transport.close()

    def close_if_idle(self) -> None:
        if not self._pending and (self._worker is None or self._worker.done()):
            self._close()


class HttpServer:
    """Accepts connections for `handle`; `stop` lets the requests being answered finish."""

    def __init__(self, handle: Handler, error_response: ErrorResponse, max_body_size: int) -> None:
        self.handle = handle
        self.error_response = error_response
        self.max_body_size = max_body_size
        self.connections: set[HttpProtocol] = set()
        self.busy = 0
        self._server: asyncio.Server | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    async def start(self, address: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: HttpProtocol(self), address, port, reuse_address=True, backlog=1024
        )
        return int(self._server.sockets[0].getsockname()[1])

    def answered(self) -> None:
        if self.busy == 0:
            self._idle.set()
        if self._server is None:  # stopping: close the connections that went idle
            for connection in list(self.connections):
                connection.close_if_idle()

    async def stop(self, timeout: float) -> None:
        """Stops accepting, closes idle connections, waits up to `timeout` for the rest."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for connection in list(self.connections):
            connection.close_if_idle()
        if self.busy:
            self._idle.clear()
            try:
                await asyncio.wait_for(self._idle.wait(), timeout)
            except TimeoutError:
                logger.warning("HTTP: %d requests still running after %.1fs; closing", self.busy, timeout)
        for connection in list(self.connections):
            connection._close()
        await server.wait_closed()


def decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """The body under its Content-Encoding (gzip or deflate); raises ValueError if corrupt,
    BodyTooLarge past `limit` bytes."""
    wbits = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}.get(
        encoding
    )
    if wbits is None:
        raise ValueError(f"unsupported Content-Encoding '{encoding}'")
    inflater = zlib.decompressobj(wbits)
    try:
        data = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        if encoding != "deflate":
            raise ValueError(str(exc)) from None
        try:  # some clients send raw deflate streams without the zlib header
            data = zlib.decompressobj(-zlib.MAX_WBITS).decompress(body, limit + 1)
        except zlib.error as raw_exc:
            raise ValueError(str(raw_exc)) from None
    if len(data) > limit:
        raise BodyTooLarge()
    return data


def _accepted_encoding(accept: str) -> str | None:
    offered = {part.split(";")[0].strip().lower() for part in accept.split(",")}
    for encoding in ("gzip", "deflate"):
        if encoding in offered:
            return encoding
    return None


def _compress(body: bytes, encoding: str) -> bytes:
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    compressor = zlib.compressobj(6, zlib.DEFLATED, wbits)
    return compressor.compress(body) + compressor.flush()


_REASONS = {status.value: status.phrase for status in HTTPStatus}


def _reason(status: int) -> str:
    return _REASONS.get(status, "Unknown")
