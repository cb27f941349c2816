"""One HTTP/1.1 client connection: its requests parsed within the limits, its time limits kept."""

from __future__ import annotations

import asyncio
import logging
from http import HTTPStatus
from typing import Protocol

import httptools

from coreserve.server.frontend_reads import FRONTEND_READS
from coreserve.server.httpd._answering import AnsweringServer, Answers
from coreserve.server.httpd._http_messages import HttpRequest, HttpResponse
from coreserve.server.httpd._limits import HttpLimits

logger = logging.getLogger(__name__)

# How long a connection closed after an error answer, or refused, stays open for its client to
# read the answer (nginx lingers for up to 30 s; an answer is read on the spot or never).
LINGER_SECS = 1.0
# At most this many refused connections linger at once, and at most a quarter of the descriptors
# the connection limit leaves; past it (a connection flood) they are closed at once, as each
# holds a descriptor while it lingers.
MAX_LINGERING_REFUSALS = 64
LINGER_DROP_BYTES = 1 << 20


class ConnectionServer(AnsweringServer, Protocol):
    """What a connection asks of its server (`HttpServer` is the one), besides what its answers
    ask: the limits and the messages of their refusals, the open connections, the refusal of
    one over the limit."""

    limits: HttpLimits
    max_body_size: int
    connection_limit: int
    head_limit: int
    file_safe_connections: int
    header_size_message: str
    trailer_message: str
    body_size_message: str
    connections: set[HttpProtocol]

    def near_file_limit(self, number: int = 0) -> None: ...

    def refuse(self, transport: asyncio.Transport) -> None: ...


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
        "gathered",
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
        self.body = b""  # the body, while it came in one piece
        # A body of several pieces, gathered as they come: joining them at the end would hold
        # the loop for the whole copy; growing a bytearray spreads the copy over the reads.
        self.gathered: bytearray | None = None
        self.size = 0
        self.too_large = False
        self.method = ""


class HttpProtocol(asyncio.Protocol):
    """One client connection: parses requests and answers them one at a time, in order.

    One timer per connection enforces the limits in time. It is not re-armed per request:
    when it fires it works out the deadline of the connection's present state (see
    `_deadline`) and sleeps again until then, so a busy keep-alive connection costs a timer
    about once per keep-alive timeout.
    """

    def __init__(self, server: ConnectionServer) -> None:
        self._server = server
        self._limits = limits = server.limits
        # Read for every request: kept here, a lookup closer.
        self._max_url_size = limits.max_url_size
        self._max_header_count = limits.max_header_count
        self._max_header_size = limits.max_header_size
        self.max_pipelined = limits.max_pipelined
        self._loop = loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        # The parser holds this object's callbacks: a cycle, broken in `connection_lost`.
        self._parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)
        self._message = _Message()
        self._answers = Answers(server, loop)
        self.closed = False
        self._parsing = True  # false once an answer that closes the connection is queued
        self._reading_paused = False
        # The state the timer reads.
        self._in_message = False  # a request's first byte arrived and its last did not
        self._headers_done = False  # ... and its headers are all in
        self._requests = 0
        self._message_started = 0.0
        self._last_read = 0.0
        self._idle_since = 0.0
        self._lingering_until: float | None = None
        self._head_bytes = 0  # bytes fed to the parser since the last request's headers ended
        self._body_progress = 0  # body and chunk callbacks so far
        self._framing_bytes = 0  # bytes of a body fed in a row without a body or chunk callback
        self._timer: asyncio.TimerHandle | None = None
        self._dropped = 0

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport
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
        self.watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._server.connections.discard(self)
        # Without the parser's cycle this object goes at once, not at the collector's next full
        # pass, and with it what it holds of its requests (a body of up to --http-max-input-size).
        self._parser = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._answers.connection_lost()

    def data_received(self, data: bytes) -> None:
        FRONTEND_READS.value += 1
        if not self._parsing:  # after an error answer: dropped, up to a budget, then unread
            self._dropped += len(data)
            if self._dropped > LINGER_DROP_BYTES:
                self._pause_reading()
            return
        parser = self._parser
        if parser is None:  # the connection is lost
            return
        self._last_read = self._loop.time()
        in_body = self._headers_done
        if in_body:
            progress = self._body_progress
        else:
            self._head_bytes += len(data)
        try:
            parser.feed_data(data)
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
            self.watch()

    def eof_received(self) -> bool | None:
        return None  # the client is done sending: close (answers still due cannot be sent)

    def pause_writing(self) -> None:
        self._answers.pause_writing()

    def resume_writing(self) -> None:
        self._answers.resume_writing()

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
        assert self._parser is not None  # a callback of the parser's own feed_data
        message.method = self._parser.get_method().decode("ascii")
        length = message.headers.get("content-length")
        expects = "expect" in message.headers and message.headers["expect"].lower() == "100-continue"
        if length is not None and length.isdigit() and int(length) > self._server.max_body_size:
            if expects:  # answered before the client sends the body it announced
                raise _Refusal(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, self._server.body_size_message)
            message.too_large = True
        elif expects and self.transport is not None and not self._answers.busy and not self._answers.pending:
            # (Behind pipelined requests still to be answered, a 100 would land in their midst;
            # the client then sends the body when its own wait for the 100 runs out.)
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

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
            message.body, message.gathered = b"", None
            return
        if message.gathered is not None:
            message.gathered += body
        elif not message.body:
            message.body = body
        else:
            message.gathered = bytearray(message.body)
            message.gathered += body
            message.body = b""

    def on_message_complete(self) -> None:
        self._in_message = self._headers_done = False
        self._requests += 1
        message = self._message
        if not self._parsing:  # the rest of a read that followed a request answered with an error
            return
        if message.too_large:
            self._refuse(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, self._server.body_size_message)
            return
        assert self._parser is not None  # a callback of the parser's own feed_data
        path, _, _ = message.url.decode("latin-1").partition("?")
        body = message.body if message.gathered is None else message.gathered
        message.body, message.gathered = b"", None  # not kept while the request is answered, nor after
        self._queue(
            HttpRequest(message.method, path, message.headers, body), self._parser.should_keep_alive()
        )

    # answering (the requests' answers are `Answers`'s)

    def _queue(self, item: HttpRequest | HttpResponse, keep_alive: bool) -> None:
        answers = self._answers
        answers.queue(self, item, keep_alive)
        if len(answers.pending) > self.max_pipelined:
            self._pause_reading()  # a client pipelining far ahead waits for answers

    def end_after_answer(self) -> None:
        """An answer that ends the connection was written: closes it, or lingers after an error."""
        if self._parsing:
            self.close()
        else:
            self.linger()

    def caught_up(self) -> None:
        """The answers caught up with a pipelining client: its reading resumes if it was paused."""
        if self._reading_paused and self._parsing:
            self._reading_paused = False
            if self.transport is not None:
                self.transport.resume_reading()

    def idle(self) -> None:
        """Every request is answered: the keep-alive timeout runs from now."""
        self._idle_since = self._loop.time()
        self.watch()

    def _refuse(self, status: int, message: str) -> None:
        """Stops reading and answers `status` after the answers already due, then closes."""
        self._parsing = False
        self._pause_reading()
        self._queue(self._server.error_response(status, message), False)

    def _pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None and not self.closed:
            self._reading_paused = True
            self.transport.pause_reading()

    # the timer

    def _deadline(self) -> tuple[float, str] | None:
        """When the connection's present state runs out of time, and which state that is."""
        limits = self._limits
        if self._lingering_until is not None:
            return self._lingering_until, "linger"
        write_blocked_since = self._answers.write_blocked_since
        if write_blocked_since is not None:
            return write_blocked_since + limits.write_timeout, "write"
        if self._in_message and self._parsing and not self._reading_paused:
            if self._headers_done:
                return self._last_read + limits.body_timeout, "body"
            return self._message_started + limits.header_timeout, "header"
        if self._answers.busy or not self._parsing:
            return None  # a handler has the time it needs; the state changes when it is done
        # A new connection has until the header timeout to send its first request.
        idle = limits.keepalive_timeout if self._requests else limits.header_timeout
        return self._idle_since + idle, "idle"

    def watch(self) -> None:
        """Makes sure the timer fires no later than the present state's deadline."""
        found = self._deadline()
        if found is None or self.closed:
            return
        timer = self._timer
        if timer is None or timer.when() > found[0]:
            if timer is not None:
                timer.cancel()
            self._timer = self._loop.call_at(found[0], self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        found = self._deadline()
        if found is None or self.closed:
            return
        deadline, state = found
        if self._loop.time() < deadline:
            self._timer = self._loop.call_at(deadline, self._on_timer)
            return
        limits = self._limits
        if state == "linger":
            self.close()
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
            self.close()

    # closing

    def linger(self) -> None:
        """Closes after an error answer, unlike `_close` without resetting the connection.

        Closing a socket with unread data resets it, and a reset can destroy the answer before
        the client reads it (the request it stopped is likely still arriving). So our side is
        shut, and what the client still sends is read and dropped for a moment (up to
        LINGER_DROP_BYTES: a client still sending past that is not reading either).
        """
        transport = self.transport
        if transport is None or self.closed:
            return
        if not transport.can_write_eof():
            self.close()
            return
        transport.write_eof()
        self._lingering_until = self._loop.time() + LINGER_SECS
        if self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()
        self.watch()

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()

    def _abort(self) -> None:
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.abort()

    def close_if_idle(self) -> None:
        if not self._answers.pending and not self._answers.busy:
            self.close()
