"""A lean HTTP/1.1 server on asyncio and httptools (the C parser uvicorn uses).

The data plane's HTTP path is short, so the web framework around it was most of a request's
CPU time; this module does only what the v2 API needs: keep-alive, pipelined requests
answered in order, Content-Length and chunked request bodies, `Expect: 100-continue`, a
body size limit (413), compressed responses on request (`http_encoding` has the codings),
and streamed (chunked) responses for server-sent events. It protects itself with the limits
and timeouts of `HttpLimits`: each is enforced as the request is parsed, before anything
past the limit is kept.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus

import httptools

from coreserve.server.http_encoding import accepted_encoding, compress
from coreserve.server.http_limits import (
    DEFAULT_HTTP_LIMITS,
    HttpLimits,
    RateLimitedWarning,
    default_max_connections,
    open_file_limit,
)

logger = logging.getLogger(__name__)
# Responses at least this large are compressed on a worker thread (zlib releases the GIL), and
# written after their head without being joined to it first.
OFF_LOOP_COMPRESS_BYTES = 256 << 10
SEPARATE_WRITE_BYTES = 64 << 10


@dataclass(slots=True)
class HttpRequest:
    method: str
    path: str
    headers: dict[str, str]  # names in lower case
    body: bytes
    match_info: dict[str, str] = field(default_factory=dict)
    # Set by a handler whose work should stop if the client goes away before its answer is
    # sent (an inference: it cancels the request); called once, on the event loop. A client
    # that left before the handler set it leaves `disconnected` true instead.
    on_disconnect: Callable[[], object] | None = None
    disconnected: bool = False


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


class _Refusal(Exception):
    """Raised from a parser callback: the request breaks a limit and gets `status` at once."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class _Message:
    """A request being parsed."""

    __slots__ = (
        "body",
        "header_count",
        "header_size",
        "headers",
        "method",
        "repeated",
        "size",
        "too_large",
        "url",
    )

    def __init__(self) -> None:
        self.url = b""
        self.headers: dict[str, str] = {}
        self.repeated: dict[str, list[str]] | None = None  # the values of headers sent more than once
        self.header_count = 0
        self.header_size = 0
        self.body: list[bytes] = []
        self.size = 0
        self.too_large = False
        self.method = ""


# What the worker answers: a parsed request, or an answer ready before any handler (an error).
_Pending = tuple[HttpRequest | HttpResponse, bool]


class HttpProtocol(asyncio.Protocol):
    """One client connection: parses requests and answers them one at a time, in order.

    One timer per connection enforces the limits in time. It is not re-armed per request:
    when it fires it works out the deadline of the connection's present state (see
    `_deadline`) and sleeps again until then, so a busy keep-alive connection costs a timer
    about once per keep-alive timeout.
    """

    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self._limits = limits = server.limits
        # Read for every request: kept here, a lookup closer.
        self._max_url_size = limits.max_url_size
        self._max_header_count = limits.max_header_count
        self._max_header_size = limits.max_header_size
        self._max_pipelined = limits.max_pipelined
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._message = _Message()
        self._pending: deque[_Pending] = deque()
        self._worker: asyncio.Task[None] | None = None
        self._answering = False
        self._current: HttpRequest | None = None  # the request being answered
        self._writable: asyncio.Future[None] | None = None
        self._closed = False
        self._parsing = True  # false once an answer that closes the connection is queued
        self._reading_paused = False
        # The state the timer reads.
        self._in_message = False  # a request's first byte arrived and its last did not
        self._headers_done = False  # ... and its headers are all in
        self._requests = 0
        self._message_started = 0.0
        self._last_read = 0.0
        self._idle_since = 0.0
        self._write_blocked_since: float | None = None
        self._lingering_until: float | None = None
        self._head_bytes = 0  # bytes fed to the parser since the last request's headers ended
        self._body_progress = 0  # body and chunk callbacks so far
        self._framing_bytes = 0  # bytes of a body fed in a row without a body or chunk callback
        self._timer: asyncio.TimerHandle | None = None
        self._dropped = 0

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport
        server = self._server
        connections = server.connections
        if len(connections) >= server.connection_limit:
            self._parsing = False
            server.refuse(transport)  # type: ignore[arg-type]
            return
        connections.add(self)
        if len(connections) > server.file_safe_connections:
            server.near_file_limit(len(connections))
        self._idle_since = self._last_read = self._loop.time()
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._server.connections.discard(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        current, self._current = self._current, None
        if current is not None:
            current.disconnected = True
            if current.on_disconnect is not None:
                current.on_disconnect()

    def data_received(self, data: bytes) -> None:
        if not self._parsing:  # after an error answer: dropped, up to a budget, then unread
            self._dropped += len(data)
            if self._dropped > LINGER_DROP_BYTES:
                self._pause_reading()
            return
        self._last_read = self._loop.time()
        in_body = self._headers_done
        if in_body:
            progress = self._body_progress
        else:
            self._head_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, _Refusal):
                self._refuse(cause.status, cause.message)
            else:
                logger.error("HTTP: parsing a request failed", exc_info=cause)
                self._refuse(HTTPStatus.INTERNAL_SERVER_ERROR, "internal server error")
            return
        except httptools.HttpParserUpgrade:
            self._refuse(HTTPStatus.NOT_IMPLEMENTED, "protocol upgrades are not supported")
            return
        except httptools.HttpParserError as exc:
            self._refuse(HTTPStatus.BAD_REQUEST, f"malformed HTTP request: {exc}")
            return
        if self._in_message:
            if not self._headers_done:
                if self._head_bytes > self._server.head_limit:
                    # httptools gathers a header in memory before handing it over; this bounds that.
                    self._refuse(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, self._server.header_size_message)
                    return
            elif in_body:
                # Bytes that bring no body are chunk framing or trailer fields, which httptools
                # also gathers in memory: a few are normal, a stream of them is not.
                if self._body_progress != progress:
                    self._framing_bytes = 0
                else:
                    self._framing_bytes += len(data)
                    if self._framing_bytes > self._server.head_limit:
                        self._refuse(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, self._server.trailer_message)
                        return
            self._watch()

    def eof_received(self) -> bool | None:
        return None  # the client is done sending: close (answers still due cannot be sent)

    def pause_writing(self) -> None:
        if self._writable is None or self._writable.done():
            self._writable = self._loop.create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    # httptools callbacks

    def on_message_begin(self) -> None:
        self._message = _Message()
        self._in_message = True
        self._message_started = self._last_read

    def on_url(self, url: bytes) -> None:
        message = self._message
        if message.url:  # the URL came in pieces
            url = message.url + url
        if len(url) > self._max_url_size:
            raise _Refusal(
                HTTPStatus.REQUEST_URI_TOO_LONG, f"URI too long: the limit is {self._max_url_size} bytes"
            )
        message.url = url

    def on_header(self, name: bytes, value: bytes) -> None:
        message = self._message
        message.header_count += 1
        message.header_size += len(name) + len(value)
        if message.header_count > self._max_header_count or message.header_size > self._max_header_size:
            if message.header_count > self._max_header_count:
                raise _Refusal(
                    HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                    f"too many header fields: the limit is {self._max_header_count}",
                )
            raise _Refusal(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, self._server.header_size_message)
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        headers = message.headers
        if key not in headers:
            headers[key] = text
        else:  # joined once the headers are all in: joining as they come is quadratic
            if message.repeated is None:
                message.repeated = {}
            message.repeated.setdefault(key, [headers[key]]).append(text)

    def on_headers_complete(self) -> None:
        self._headers_done = True
        self._head_bytes = 0
        message = self._message
        if message.repeated is not None:
            for key, values in message.repeated.items():
                message.headers[key] = ", ".join(values)
        message.method = self._parser.get_method().decode("ascii")
        length = message.headers.get("content-length")
        expects = "expect" in message.headers and message.headers["expect"].lower() == "100-continue"
        if length is not None and length.isdigit() and int(length) > self._server.max_body_size:
            if expects:  # answered before the client sends the body it announced
                raise _Refusal(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, self._server.body_size_message)
            message.too_large = True
        elif expects and self._transport is not None and not self._answering and not self._pending:
            # (Behind pipelined requests still to be answered, a 100 would land in their midst;
            # the client then sends the body when its own wait for the 100 runs out.)
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_chunk_header(self) -> None:
        self._body_progress += 1

    def on_chunk_complete(self) -> None:
        self._body_progress += 1

    def on_body(self, body: bytes) -> None:
        self._body_progress += 1
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
        self._in_message = self._headers_done = False
        self._requests += 1
        message = self._message
        if not self._parsing:  # the rest of a read that followed a request answered with an error
            return
        if message.too_large:
            self._refuse(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, self._server.body_size_message)
            return
        path, _, _ = message.url.decode("latin-1").partition("?")
        body = message.body[0] if len(message.body) == 1 else b"".join(message.body)
        pending = self._pending
        pending.append(
            (HttpRequest(message.method, path, message.headers, body), self._parser.should_keep_alive())
        )
        if len(pending) > self._max_pipelined:
            self._pause_reading()  # a client pipelining far ahead waits for answers
        if not self._answering:
            self._answering = True
            self._worker = self._loop.create_task(self._answer())

    # answering

    def _queue(self, item: HttpRequest | HttpResponse, keep_alive: bool) -> None:
        self._pending.append((item, keep_alive))
        if len(self._pending) > self._max_pipelined:
            self._pause_reading()
        if not self._answering:
            self._answering = True
            self._worker = self._loop.create_task(self._answer())

    def _refuse(self, status: int, message: str) -> None:
        """Stops reading and answers `status` after the answers already due, then closes."""
        self._parsing = False
        self._pause_reading()
        self._queue(self._server.error_response(status, message), False)

    def _pause_reading(self) -> None:
        if not self._reading_paused and self._transport is not None and not self._closed:
            self._reading_paused = True
            self._transport.pause_reading()

    async def _answer(self) -> None:
        server = self._server
        answered = 0
        try:
            while self._pending and not self._closed:
                if answered == self._max_pipelined:  # a deep pipeline lets other clients in
                    answered = 0
                    await asyncio.sleep(0)
                    continue
                answered += 1
                item, keep_alive = self._pending.popleft()
                server.busy += 1
                try:
                    if isinstance(item, HttpResponse):
                        await self._send(item, {}, keep_alive)
                    else:
                        self._current = item
                        await self._send(await server.handle(item), item.headers, keep_alive)
                except Exception:
                    logger.exception("HTTP request failed")
                    keep_alive = False
                    await self._send(server.error_response(500, "internal server error"), {}, False)
                finally:
                    self._current = None
                    server.busy -= 1
                    server.answered()
                if not keep_alive:
                    if self._parsing:
                        self._close()
                    else:
                        self._linger()
                    return
                caught_up = len(self._pending) <= self._max_pipelined
                if self._reading_paused and self._parsing and caught_up:
                    self._reading_paused = False
                    if self._transport is not None:
                        self._transport.resume_reading()
        finally:
            self._answering = False
        if not self._closed:
            self._idle_since = self._loop.time()
            self._watch()

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
            encoding = accepted_encoding(accept)
            if encoding is not None:
                if len(body) < OFF_LOOP_COMPRESS_BYTES:
                    body = compress(body, encoding)
                else:  # zlib lets go of the GIL: a large body compresses beside the loop
                    body = await asyncio.to_thread(compress, body, encoding)
                extra += f"Content-Encoding: {encoding}\r\n"
        if response.content_type is not None:
            extra += f"Content-Type: {response.content_type}\r\n"
        head = (
            f"HTTP/1.1 {response.status} {_reason(response.status)}\r\nContent-Length: {len(body)}\r\n{extra}"
        )
        if len(body) < SEPARATE_WRITE_BYTES:
            self._transport.write(head.encode("latin-1") + connection + b"\r\n" + body)
        else:  # no copy of a large body just to put the head before it
            self._transport.writelines((head.encode("latin-1"), connection, b"\r\n", body))
        await self._drained()

    async def _send_streamed(self, response: StreamedResponse, connection: bytes) -> None:
        assert self._transport is not None
        extra = "".join(f"{name}: {value}\r\n" for name, value in response.headers.items())
        head = (
            f"HTTP/1.1 {response.status} {_reason(response.status)}\r\nTransfer-Encoding: chunked\r\n{extra}"
        )
        self._transport.write(head.encode("latin-1") + connection + b"\r\n")
        chunks = response.chunks
        try:
            async for chunk in chunks:
                if self._closed:
                    return
                if chunk:
                    self._transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
                    await self._drained()
            if not self._closed:
                self._transport.write(b"0\r\n\r\n")
        finally:
            close = getattr(chunks, "aclose", None)  # an async generator's cleanup runs now, not at GC
            if close is not None:
                await close()

    async def _drained(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._write_blocked_since = self._loop.time()
            self._watch()
            try:
                await self._writable
            finally:
                self._write_blocked_since = None

    # the timer

    def _deadline(self) -> tuple[float, str] | None:
        """When the connection's present state runs out of time, and which state that is."""
        limits = self._limits
        if self._lingering_until is not None:
            return self._lingering_until, "linger"
        if self._write_blocked_since is not None:
            return self._write_blocked_since + limits.write_timeout, "write"
        if self._in_message and self._parsing and not self._reading_paused:
            if self._headers_done:
                return self._last_read + limits.body_timeout, "body"
            return self._message_started + limits.header_timeout, "header"
        if self._answering or not self._parsing:
            return None  # a handler has the time it needs; the state changes when it is done
        # A new connection has until the header timeout to send its first request.
        idle = limits.keepalive_timeout if self._requests else limits.header_timeout
        return self._idle_since + idle, "idle"

    def _watch(self) -> None:
        """Makes sure the timer fires no later than the present state's deadline."""
        found = self._deadline()
        if found is None or self._closed:
            return
        timer = self._timer
        if timer is None or timer.when() > found[0]:
            if timer is not None:
                timer.cancel()
            self._timer = self._loop.call_at(found[0], self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        found = self._deadline()
        if found is None or self._closed:
            return
        deadline, state = found
        if self._loop.time() < deadline:
            self._timer = self._loop.call_at(deadline, self._on_timer)
            return
        limits = self._limits
        if state == "linger":
            self._close()
        elif state == "write":
            logger.debug("HTTP: dropped a client that took no answer for %.1fs", limits.write_timeout)
            self._abort()
        elif state == "header":
            self._refuse(
                HTTPStatus.REQUEST_TIMEOUT,
                f"request headers not received within {limits.header_timeout:g}s",
            )
        elif state == "body":
            self._refuse(
                HTTPStatus.REQUEST_TIMEOUT,
                f"request body: nothing received for {limits.body_timeout:g}s",
            )
        else:
            self._close()

    # closing

    def _linger(self) -> None:
        """Closes after an error answer, unlike `_close` without resetting the connection.

        Closing a socket with unread data resets it, and a reset can destroy the answer before
        the client reads it (the request it stopped is likely still arriving). So our side is
        shut, and what the client still sends is read and dropped for a moment (up to
        LINGER_DROP_BYTES: a client still sending past that is not reading either).
        """
        transport = self._transport
        if transport is None or self._closed:
            return
        if not transport.can_write_eof():
            self._close()
            return
        transport.write_eof()
        self._lingering_until = self._loop.time() + LINGER_SECS
        if self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()
        self._watch()

    def _close(self) -> None:
        if self._transport is not None and not self._closed:
            self._closed = True
            self._transport.close()

    def _abort(self) -> None:
        if self._transport is not None and not self._closed:
            self._closed = True
            self._transport.abort()

    def close_if_idle(self) -> None:
        if not self._pending and not self._answering:
            self._close()


# How long a connection closed after an error answer, or refused, stays open for its client to
# read the answer (nginx lingers for up to 30 s; an answer is read on the spot or never).
LINGER_SECS = 1.0
# At most this many refused connections linger at once, and at most a quarter of the descriptors
# the connection limit leaves; past it (a connection flood) they are closed at once, as each
# holds a descriptor while it lingers.
MAX_LINGERING_REFUSALS = 64
LINGER_DROP_BYTES = 1 << 20


class _RefusedConnection(asyncio.Protocol):
    """A connection over the limit: it gets a 503, then is closed once the client saw it."""

    def __init__(self, server: HttpServer, transport: asyncio.Transport, response: bytes) -> None:
        self._server = server
        transport.set_protocol(self)
        transport.write(response)
        # Closing at once could reset the connection (the request unread) before the client
        # reads the 503: the write side is shut instead, and the client closes.
        transport.write_eof()
        server.lingering_refusals += 1
        self._timer = asyncio.get_running_loop().call_later(LINGER_SECS, transport.close)

    def data_received(self, data: bytes) -> None:
        pass  # the request: unanswered

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.lingering_refusals -= 1
        self._timer.cancel()


class HttpServer:
    """Accepts connections for `handle`; `stop` lets the requests being answered finish."""

    def __init__(
        self,
        handle: Handler,
        error_response: ErrorResponse,
        max_body_size: int,
        limits: HttpLimits = DEFAULT_HTTP_LIMITS,
    ) -> None:
        self.handle = handle
        self.error_response = error_response
        self.max_body_size = max_body_size
        self.limits = limits
        self.connection_limit = limits.connection_limit()
        # The request line and the separators of the headers come on top of their names and values.
        self.head_limit = limits.max_url_size + limits.max_header_size + 4 * limits.max_header_count + 1024
        self.header_size_message = (
            f"request header fields too large: the limit is {limits.max_header_size} bytes"
        )
        self.trailer_message = "request body framing or trailer fields too large"
        self.body_size_message = f"request body too large: the limit is {max_body_size} bytes"
        self.connections: set[HttpProtocol] = set()
        self.busy = 0
        self._server: asyncio.Server | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self._refused = RateLimitedWarning(
            logger,
            f"HTTP: refused %d connections over the limit of {self.connection_limit} "
            "(--http-max-connections) in the last few seconds",
        )
        self._refusal: bytes | None = None
        self.lingering_refusals = 0
        files = open_file_limit()
        spare = MAX_LINGERING_REFUSALS if files is None else (files - self.connection_limit) // 4
        self._max_lingering_refusals = max(0, min(MAX_LINGERING_REFUSALS, spare))
        # Past this many connections, accept() may run out of descriptors: the system then
        # resets new clients, unseen by us, so the condition is logged as it approaches.
        self.file_safe_connections = default_max_connections()
        self.near_file_limit = RateLimitedWarning(
            logger,
            "HTTP: %d connections open, near the open-file limit (ulimit -n): new clients may be reset "
            "without an answer; lower --http-max-connections or raise the limit",
            count_events=False,
        )
        if self.connection_limit > self.file_safe_connections:
            logger.warning(
                "HTTP: --http-max-connections=%d is above 3/4 of the open-file limit (ulimit -n); "
                "past about %d connections new clients may be reset without an answer",
                self.connection_limit,
                self.file_safe_connections,
            )

    async def start(self, address: str, port: int, tls: ssl.SSLContext | None = None) -> int:
        """Listens; with `tls`, each connection's handshake must finish within the header timeout."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: HttpProtocol(self),
            address,
            port,
            reuse_address=True,
            backlog=1024,
            ssl=tls,
            ssl_handshake_timeout=self.limits.header_timeout if tls is not None else None,
        )
        return int(self._server.sockets[0].getsockname()[1])

    def refuse(self, transport: asyncio.Transport) -> None:
        """Answers a connection over the limit with 503 and closes it."""
        self._refused()
        if self._refusal is None:
            error = self.error_response(
                HTTPStatus.SERVICE_UNAVAILABLE, f"too many connections: the limit is {self.connection_limit}"
            )
            self._refusal = (
                f"HTTP/1.1 503 {_reason(503)}\r\nContent-Length: {len(error.body)}\r\n"
                f"Content-Type: {error.content_type}\r\nConnection: close\r\n\r\n"
            ).encode("latin-1") + error.body
        if self.lingering_refusals < self._max_lingering_refusals and transport.can_write_eof():
            _RefusedConnection(self, transport, self._refusal)
        else:
            transport.write(self._refusal)
            transport.close()

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


_REASONS = {status.value: status.phrase for status in HTTPStatus}


def _reason(status: int) -> str:
    return _REASONS.get(status, "Unknown")
