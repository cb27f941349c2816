"""The answering part of an HTTP connection: handlers called in order, their answers written."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from http import HTTPStatus
from typing import TYPE_CHECKING

from coreserve.server.httpd._encoding import accepted_encoding, compress
from coreserve.server.httpd._messages import HttpRequest, HttpResponse, Response, StreamedResponse

if TYPE_CHECKING:
    from coreserve.server.httpd._connection import Pending
    from coreserve.server.httpd._server import HttpServer

logger = logging.getLogger(__name__)
# Responses at least this large are compressed on a worker thread (zlib releases the GIL), and
# written after their head without being joined to it first.
OFF_LOOP_COMPRESS_BYTES = 256 << 10
SEPARATE_WRITE_BYTES = 64 << 10


class AnsweringPart:
    """HttpProtocol's answering: the worker that answers the pending requests one at a time."""

    _server: HttpServer
    _loop: asyncio.AbstractEventLoop
    _transport: asyncio.Transport | None
    _pending: deque[Pending]
    _max_pipelined: int
    _answering: bool
    _current: HttpRequest | None
    _writable: asyncio.Future[None] | None
    _closed: bool
    _parsing: bool
    _reading_paused: bool
    _idle_since: float
    _write_blocked_since: float | None

    # The connection's own, defined by HttpProtocol.
    def _close(self) -> None:
        raise NotImplementedError

    def _linger(self) -> None:
        raise NotImplementedError

    def _watch(self) -> None:
        raise NotImplementedError

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
        status_line = f"HTTP/1.1 {response.status} {reason_phrase(response.status)}\r\n"
        head = f"{status_line}Content-Length: {len(body)}\r\n{extra}"
        if len(body) < SEPARATE_WRITE_BYTES:
            self._transport.write(head.encode("latin-1") + connection + b"\r\n" + body)
        else:  # no copy of a large body just to put the head before it
            self._transport.writelines((head.encode("latin-1"), connection, b"\r\n", body))
        await self._drained()

    async def _send_streamed(self, response: StreamedResponse, connection: bytes) -> None:
        assert self._transport is not None
        extra = "".join(f"{name}: {value}\r\n" for name, value in response.headers.items())
        status_line = f"HTTP/1.1 {response.status} {reason_phrase(response.status)}\r\n"
        head = f"{status_line}Transfer-Encoding: chunked\r\n{extra}"
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


_REASONS = {status.value: status.phrase for status in HTTPStatus}


def reason_phrase(status: int) -> str:
    return _REASONS.get(status, "Unknown")
