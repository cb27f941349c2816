"""The answers of an HTTP connection: handlers called in order, their answers written."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from http import HTTPStatus
from typing import Protocol

from coreserve.server.httpd._encoding import accepted_encoding, compress
from coreserve.server.httpd._http_messages import (
    ErrorResponse,
    Handler,
    HttpRequest,
    HttpResponse,
    Response,
    StreamedResponse,
)

# What is answered: a parsed request, or an answer ready before any handler (an error).
Pending = tuple[HttpRequest | HttpResponse, bool]

logger = logging.getLogger(__name__)
# Responses at least this large are compressed on a worker thread (zlib releases the GIL), and
# written after their head without being joined to it first.
OFF_LOOP_COMPRESS_BYTES = 256 << 10
SEPARATE_WRITE_BYTES = 64 << 10


class AnsweringServer(Protocol):
    """What answers ask of their server (`HttpServer` is the one): the handler, its error
    answers, whether it stops, and its count of the requests being answered, told as each one
    is answered."""

    handle: Handler
    error_response: ErrorResponse
    stopping: bool
    busy: int

    def answered(self) -> None: ...


class AnsweredConnection(Protocol):
    """What answers ask of their connection (`HttpProtocol` is the one): its transport and
    state, and what HTTP's framing decides after an answer."""

    max_pipelined: int
    closed: bool
    transport: asyncio.Transport | None

    def end_after_answer(self) -> None: ...

    def caught_up(self) -> None: ...

    def idle(self) -> None: ...

    def watch(self) -> None: ...


class Answers:
    """The answers of one connection: its requests answered one at a time, in order, and each
    answer written as the client takes it.

    Its connection owns it, hands it each request (`queue`) and tells it of the transport's
    state (`pause_writing`, `resume_writing`, `connection_lost`); it asks the connection back
    only what HTTP's framing decides (whether to go on reading, close, or linger after an
    answer). It keeps no reference to the connection between answers: a connection that is
    lost is freed at once, without waiting for the garbage collector to find a cycle.
    """

    __slots__ = (
        "_loop",
        "_server",
        "_worker",
        "_writable",
        "busy",
        "current",
        "pending",
        "write_blocked_since",
    )

    def __init__(self, server: AnsweringServer, loop: asyncio.AbstractEventLoop) -> None:
        self._server = server
        self._loop = loop
        self.pending: deque[Pending] = deque()
        self.busy = False  # a worker task is answering the pending requests
        self.current: HttpRequest | None = None  # the request being answered
        self.write_blocked_since: float | None = None  # while an answer waits for the client to read
        self._worker: asyncio.Task[None] | None = None
        self._writable: asyncio.Future[None] | None = None

    def queue(
        self, connection: AnsweredConnection, item: HttpRequest | HttpResponse, keep_alive: bool
    ) -> None:
        """Adds a request (or an answer ready without a handler) after those already due."""
        self.pending.append((item, keep_alive))
        if not self.busy:
            self.busy = True
            self._worker = self._loop.create_task(self._answer(connection))

    def pause_writing(self) -> None:
        if self._writable is None or self._writable.done():
            self._writable = self._loop.create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def connection_lost(self) -> None:
        """Drops what is due, wakes a write that waits, and tells the handler of the request
        being answered that its client is gone."""
        self.pending.clear()
        self.resume_writing()
        current, self.current = self.current, None
        if current is not None:
            current.disconnected = True
            if current.on_disconnect is not None:
                current.on_disconnect()

    async def _answer(self, connection: AnsweredConnection) -> None:
        server = self._server
        max_pipelined = connection.max_pipelined
        answered = 0
        try:
            while self.pending and not connection.closed:
                if answered == max_pipelined:  # a deep pipeline lets other clients in
                    answered = 0
                    await asyncio.sleep(0)
                    continue
                answered += 1
                item, keep_alive = self.pending.popleft()
                server.busy += 1
                try:
                    answer: Response
                    if isinstance(item, HttpResponse):
                        answer, headers, head = item, {}, False
                    else:
                        self.current = item
                        answer, headers, head = await server.handle(item), item.headers, item.method == "HEAD"
                    # A stopping server closes the connection after this answer, and says so.
                    keep_alive = keep_alive and not server.stopping
                    await self._send(connection, answer, headers, keep_alive, head)
                except Exception:
                    logger.exception("HTTP request failed")
                    keep_alive = False
                    await self._send(
                        connection, server.error_response(500, "internal server error"), {}, False
                    )
                finally:
                    self.current = None
                    server.busy -= 1
                    server.answered()
                if not keep_alive:
                    connection.end_after_answer()
                    return
                if len(self.pending) <= max_pipelined:
                    connection.caught_up()
        finally:
            self.busy = False
        if not connection.closed:
            connection.idle()

    async def _send(
        self,
        connection: AnsweredConnection,
        response: Response,
        request_headers: dict[str, str],
        keep_alive: bool,
        head: bool = False,
    ) -> None:
        """`head`: the answer to a HEAD request, its headers without the body."""
        transport = connection.transport
        if connection.closed or transport is None:
            return
        close = b"" if keep_alive else b"Connection: close\r\n"
        if isinstance(response, StreamedResponse):
            await self._send_streamed(connection, transport, response, close)
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
        status_line = f"HTTP/1.1 {response.status} {reason_phrase(response.status)}\r\n"
        lines = f"{status_line}Content-Length: {len(body)}\r\n{extra}"
        if head:
            body = b""
        if len(body) < SEPARATE_WRITE_BYTES:
            transport.write(lines.encode("latin-1") + close + b"\r\n" + body)
        else:  # no copy of a large body just to put the head before it
            transport.writelines((lines.encode("latin-1"), close, b"\r\n", body))
        await self._drained(connection)

    async def _send_streamed(
        self,
        connection: AnsweredConnection,
        transport: asyncio.Transport,
        response: StreamedResponse,
        close: bytes,
    ) -> None:
        extra = "".join(f"{name}: {value}\r\n" for name, value in response.headers.items())
        status_line = f"HTTP/1.1 {response.status} {reason_phrase(response.status)}\r\n"
        head = f"{status_line}Transfer-Encoding: chunked\r\n{extra}"
        transport.write(head.encode("latin-1") + close + b"\r\n")
        chunks = response.chunks
        try:
            async for chunk in chunks:
                if connection.closed:
                    return
                if chunk:
                    transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
                    await self._drained(connection)
            if not connection.closed:
                transport.write(b"0\r\n\r\n")
        finally:
            aclose = getattr(chunks, "aclose", None)  # an async generator's cleanup runs now, not at GC
            if aclose is not None:
                await aclose()

    async def _drained(self, connection: AnsweredConnection) -> None:
        if self._writable is not None and not self._writable.done():
            self.write_blocked_since = self._loop.time()
            connection.watch()
            try:
                await self._writable
            finally:
                self.write_blocked_since = None


_REASONS = {status.value: status.phrase for status in HTTPStatus}


def reason_phrase(status: int) -> str:
    return _REASONS.get(status, "Unknown")
