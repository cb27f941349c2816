"""Answers under the client's HTTP/2 flow control: DATA frames as its windows allow, then trailers.

A small answer that fits the windows goes out at once as one frame; a larger one, or one
behind another, is queued on its call and framed as WINDOW_UPDATEs come in. The handler that
sends waits (Call.send) while its call has bytes queued or the socket's buffer is full, so a
client that reads slowly holds its answers back instead of filling the server's memory.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable
from typing import Generic, Protocol, TypeVar

from coreserve.protocol.grpc_response import SerializedPieces
from coreserve.server.grpc.native.frames import _wire as wire
from coreserve.server.grpc.native.headers._response import ResponseHeaderEncoder

# Pieces of a message smaller than this are joined with their neighbours (see _coalesced).
COALESCE_BELOW = 16 * 1024


class OutboundStream(Protocol):
    """What of a call its answer's sending reads and keeps (`_calls.Call` is the one): its stream,
    its send credit, the bytes and trailers that wait for the windows, the handler that waits."""

    stream_id: int
    gzip_level: int
    reset: bool
    headers_sent: bool
    send_credit: int
    outbound: deque[memoryview]
    trailers: tuple[int, str, bool] | None
    drained: asyncio.Future[None] | None


Stream = TypeVar("Stream", bound=OutboundStream)


class Outbound(Generic[Stream]):
    """One connection's send windows and the calls whose answers wait for them."""

    def __init__(self, write: Callable[..., None], stream_done: Callable[[Stream], None]) -> None:
        self._write = write
        self._stream_done = stream_done
        self.window = wire.DEFAULT_WINDOW  # the connection's send window
        self.initial = wire.DEFAULT_WINDOW  # the client's SETTINGS_INITIAL_WINDOW_SIZE
        self._top_credit = 0  # at least any open stream's send credit (see initial_window)
        self.max_frame = wire.DEFAULT_MAX_FRAME
        self.paused = False  # the transport's buffer is full
        self._blocked: dict[int, Stream] = {}
        self._waiting: set[Stream] = set()  # handlers held back in wait_drained
        self.header_blocks = ResponseHeaderEncoder()  # every header block of the connection's

    def grant(self, call: Stream, increment: int) -> bool:
        """A WINDOW_UPDATE for `call`; False where it takes the window past 2^31-1 (RFC 9113 6.9.1)."""
        credit = call.send_credit + increment
        if self.initial + credit > wire.MAX_WINDOW:
            return False
        call.send_credit = credit
        self._top_credit = max(self._top_credit, credit)
        self.send_pending(call)
        return True

    def initial_window(self, value: int, calls: Iterable[Stream]) -> bool:
        """The client changed its initial window, which moves every open stream's window by the
        change (each window is the initial one and its stream's credit). False where a window
        would pass 2^31-1 (RFC 9113 6.9.2).

        The check costs nothing per stream while no stream has credit that could take it past:
        `_top_credit` bounds every open stream's credit from above, and is computed again only
        where it would fail. So a flood of changes costs what its frames cost.

        Nothing is sent here: the caller acknowledges the SETTINGS first, then calls
        `send_blocked`, since a client counts its windows under the settings we acknowledged.
        """
        if value + self._top_credit > wire.MAX_WINDOW:
            self._top_credit = max((call.send_credit for call in calls), default=0)
            if value + self._top_credit > wire.MAX_WINDOW:
                return False
        self.initial = value
        return True

    def send_message(self, call: Stream, prefix: bytes, message: bytes | SerializedPieces) -> None:
        if not call.headers_sent:
            call.headers_sent = True
            block = self.header_blocks.headers(gzip=bool(call.gzip_level))
            self._write(wire.frame(wire.HEADERS, wire.END_HEADERS, call.stream_id, block))
        if isinstance(message, SerializedPieces):  # large: its large pieces are framed, not joined
            call.outbound.extend(_coalesced(prefix, message.pieces))
            self.send_pending(call)
            return
        size = len(prefix) + len(message)
        if not call.outbound and size <= min(self.initial + call.send_credit, self.window, self.max_frame):
            call.send_credit -= size
            self.window -= size
            self._write(wire.frame_header(wire.DATA, 0, call.stream_id, size), prefix, message)
            return
        call.outbound.append(memoryview(prefix))
        call.outbound.append(memoryview(message))
        self.send_pending(call)

    def send_trailers(self, call: Stream, code: int, details: str) -> None:
        # Encoded when they go out (see `headers._response`); without headers before: trailers only.
        call.trailers = (code, details, not call.headers_sent)
        call.headers_sent = True
        self.send_pending(call)

    def send_pending(self, call: Stream) -> None:
        """Frames what the windows allow of `call`'s answer; ends the stream once all is out."""
        outbound = call.outbound
        while outbound:
            room = min(self.initial + call.send_credit, self.window, self.max_frame)
            if room <= 0:
                self._blocked[call.stream_id] = call
                return
            chunk = outbound[0]
            if len(chunk) <= room:
                outbound.popleft()
            else:
                outbound[0] = chunk[room:]
                chunk = chunk[:room]
            call.send_credit -= len(chunk)
            self.window -= len(chunk)
            self._write(wire.frame_header(wire.DATA, 0, call.stream_id, len(chunk)), chunk)
        self._blocked.pop(call.stream_id, None)
        self._wake(call)
        if call.trailers is not None:
            block = self.header_blocks.trailers(*call.trailers)
            self._write(wire.frame(wire.HEADERS, wire.END_HEADERS | wire.END_STREAM, call.stream_id, block))
            call.trailers = None
            self._stream_done(call)

    def send_blocked(self) -> None:
        for call in list(self._blocked.values()):
            if self.window <= 0:
                return
            self.send_pending(call)

    def forget(self, call: Stream) -> None:
        """`call` was reset: nothing more of it goes out."""
        self._blocked.pop(call.stream_id, None)
        call.outbound.clear()
        self._wake(call)

    async def wait_drained(self, call: Stream) -> None:
        self._waiting.add(call)
        try:
            while (call.outbound or self.paused) and not call.reset:
                call.drained = asyncio.get_running_loop().create_future()
                await call.drained
        finally:
            self._waiting.discard(call)

    def _wake(self, call: Stream) -> None:
        if call.drained is not None and not call.drained.done() and (not self.paused or call.reset):
            call.drained.set_result(None)

    def wake_all(self, closed: bool = False) -> None:
        """The transport can take more (or is gone: `closed`): waiting handlers go on."""
        # Every waiting handler: one whose bytes all went to the transport waits for the
        # transport alone, and is in no window's queue.
        for call in list(self._waiting):
            if closed:
                call.outbound.clear()
            self._wake(call)


def _coalesced(prefix: bytes, pieces: list[bytes | memoryview]) -> list[memoryview]:
    """A message's pieces with the small ones joined to their neighbours: DATA frames never
    span two pieces, so each run of small pieces would otherwise go out as frames of a few bytes."""
    chunks: list[memoryview] = []
    small: list[bytes | memoryview] = [prefix]
    for piece in pieces:
        if len(piece) < COALESCE_BELOW:
            small.append(piece)
            continue
        if small:
            chunks.append(memoryview(b"".join(small)))
            small = []
        chunks.append(memoryview(piece))
    if small:
        chunks.append(memoryview(b"".join(small)))
    return chunks
