"""One HTTP/2 connection of the native gRPC server: frames in, calls started, frames out.

The connection reads frames and answers those of the connection itself (SETTINGS, PING, the
connection's WINDOW_UPDATE, GOAWAY); its `Streams` (`_streams`) handle what concerns one
stream, and its `Outbound` (`_sending`) the answers. Flow control both ways: the client gets
its receive windows back as its bytes arrive (see `_streams`), and answers wait for the
client's windows. Frames the
connection writes while handling one read go out in one write; answers written from handler
tasks are gathered until the loop's next turn.

A client that does not take what the server writes is not read from until it does (so PINGs
and SETTINGS, whose answers it would leave unread, cannot pile them up), and one turn of the
event loop reads a bounded number of a connection's frames and new streams (`limits`). Frames
that break RFC 9113 end their stream or the connection with the error code the RFC names.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from coreserve.server.frontend_reads import FRONTEND_READS
from coreserve.server.grpc._transport import GrpcTransport
from coreserve.server.grpc.native._calls import Call
from coreserve.server.grpc.native._keepalive import PING_PAYLOAD, KeepaliveTimers
from coreserve.server.grpc.native._limits import (
    CONNECTION_WINDOW,
    GLITCH_BURST,
    GLITCH_RATE,
    MAX_CONCURRENT,
    MAX_CONTINUATIONS,
    MAX_FRAME_SIZE,
    MAX_HEADER_BLOCK,
    MAX_HEADER_LIST,
    MAX_QUEUED_ACKS,
    STREAM_WINDOW,
    STREAMS_PER_TURN,
    RateBudget,
)
from coreserve.server.grpc.native._sending import Outbound
from coreserve.server.grpc.native._streams import Streams
from coreserve.server.grpc.native.frames import _payloads as payloads
from coreserve.server.grpc.native.frames import _wire as wire
from coreserve.server.grpc.native.frames._reader import FrameReader
from coreserve.server.grpc.native.frames._wire import ConnectionFault
from coreserve.server.grpc.native.headers._request import HeaderBlockDecoder

logger = logging.getLogger("coreserve.server.grpc")

# --grpc-infer-response-compression-level as zlib's levels
GZIP_LEVELS = {"none": 0, "low": 1, "medium": 6, "high": 9}
FLUSH_SECONDS = 1.0  # what a closing connection's client has to take our last frames


@dataclass(slots=True)
class _PendingBlock:
    """A header block whose HEADERS frame came, with CONTINUATION frames still to come."""

    stream_id: int
    flags: int  # the HEADERS frame's
    block: bytearray
    continuations: int = 0


class Http2Connection(asyncio.Protocol):
    """The server side of one client connection."""

    def __init__(
        self,
        handlers: dict[str, grpc.RpcMethodHandler],
        max_message_size: int,
        settings: GrpcTransport,
        on_close: Callable[[Http2Connection], None],
        on_open: Callable[[Http2Connection], None] | None = None,
    ) -> None:
        """`on_open` and `on_close`: called once the connection is made (under TLS: once its
        handshake is done; one that fails it never is) and once it is lost."""
        self.handlers = handlers
        self._transport_settings = settings
        self.gzip_level = GZIP_LEVELS[settings.compression_level]
        self._keepalive: KeepaliveTimers | None = None
        self.max_message_size = max_message_size
        self._on_close = on_close
        self._on_open = on_open
        self.transport: Any = None
        self.peer = ""
        self.streams = Streams(self, handlers, max_message_size)
        self._reader = FrameReader(self._frame, self.streams.data, lambda: self._continuation is not None)
        self._preface_timer: asyncio.TimerHandle | None = None
        self._decoder = HeaderBlockDecoder(MAX_HEADER_LIST)
        self._continuation: _PendingBlock | None = None
        self.outbound = Outbound(self.write, self.streams.stream_done)
        self.out: list[bytes | memoryview] = []  # the frames of this turn, written together
        self._flush_scheduled = False
        self._closed = asyncio.get_running_loop().create_future()
        self._glitches = RateBudget(GLITCH_BURST, GLITCH_RATE)
        self._reading = True  # the transport reads (see _read_on)
        self._abort_timer: asyncio.TimerHandle | None = None  # see _close
        self._turn_scheduled = False
        self._queued_acks = 0  # SETTINGS and PING answers written while the client reads nothing

    @property
    def calls(self) -> dict[int, Call]:
        return self.streams.calls

    # asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        if self._on_open is not None:
            self._on_open(self)
        address = transport.get_extra_info("peername")
        self.peer = f"ipv4:{address[0]}:{address[1]}" if address else ""
        self.out.append(
            wire.settings_frame(
                {
                    wire.MAX_CONCURRENT_STREAMS: MAX_CONCURRENT,
                    wire.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
                    wire.MAX_FRAME_SIZE: MAX_FRAME_SIZE,
                    wire.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST,
                }
            )
            + wire.window_update(0, CONNECTION_WINDOW - wire.DEFAULT_WINDOW)
        )
        self.flush()
        # A client that never says it speaks HTTP/2 is dropped, as gRPC core's handshake timeout does.
        self._preface_timer = asyncio.get_running_loop().call_later(
            self._transport_settings.handshake_timeout_s, self.transport.abort
        )
        self._keepalive = KeepaliveTimers(
            self._transport_settings,
            send_ping=lambda: self.write(wire.frame(wire.PING, 0, 0, PING_PAYLOAD)),
            go_away=self._go_away,
            close=self.close,
            has_calls=lambda: bool(self.calls),
        )

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._preface_timer, self._abort_timer):
            if timer is not None:
                timer.cancel()
        if self._keepalive is not None:
            self._keepalive.cancel()
        self._cancel_calls()
        self.outbound.wake_all(closed=True)
        self._reader.drop()
        if not self._closed.done():
            self._closed.set_result(None)
        self._on_close(self)

    def pause_writing(self) -> None:
        # The client does not take what we write: nothing more of it is read until it does.
        self.outbound.paused = True
        self._read_on(False)

    def resume_writing(self) -> None:
        self.outbound.paused = False
        if self._reader.backlog:
            self._schedule_turn()
        else:
            self._read_on(True)
        self.outbound.wake_all()

    def _read_on(self, reading: bool) -> None:
        if reading != self._reading and not self.transport.is_closing():
            self._reading = reading
            if reading:
                self.transport.resume_reading()
            else:
                self.transport.pause_reading()

    def data_received(self, data: bytes) -> None:
        FRONTEND_READS.value += 1
        self._read(data)

    def _schedule_turn(self) -> None:
        if not self._turn_scheduled:
            self._turn_scheduled = True
            asyncio.get_running_loop().call_soon(self._next_turn)

    def _next_turn(self) -> None:
        """Reads the frames a former turn left in the buffer (see `frames._reader`)."""
        self._turn_scheduled = False
        if not self.outbound.paused and not self.transport.is_closing():
            self._read(None)

    def _read(self, data: bytes | None) -> None:
        """Hands the frame reader a read's bytes (None: what a former turn left); what it leaves
        for later turns holds the transport's reading until it is handled, as does a client that
        does not take what we write."""
        try:
            if data is None:
                self._reader.next_turn()
            else:
                self._reader.feed(data)
        except ConnectionFault as fault:
            self._fail_connection(fault)
            return
        except Exception:  # a fault of ours: this connection ends, the server goes on
            logger.exception("gRPC connection from %s failed", self.peer)
            self._fail_connection(ConnectionFault(wire.INTERNAL_ERROR, "internal error"))
            return
        self.streams.start_calls()
        if self._preface_timer is not None and self._reader.preface_seen:
            self._preface_timer.cancel()
            self._preface_timer = None
        self.flush()
        backlog = self._reader.backlog
        if backlog and not self.outbound.paused:
            self._schedule_turn()
        self._read_on(not backlog and not self.outbound.paused)

    # Frames --------------------------------------------------------------------------------

    def _frame(self, kind: int, flags: int, stream_id: int, payload: memoryview) -> None:
        if self._continuation is not None and kind != wire.CONTINUATION:
            raise ConnectionFault(wire.PROTOCOL_ERROR, "a header block interrupted")
        if kind == wire.DATA:
            self.streams.data(flags, stream_id, payload, False)
        elif kind == wire.HEADERS:
            self._headers(flags, stream_id, payload)
        elif kind == wire.CONTINUATION:
            self._continue_headers(flags, stream_id, payload)
        elif kind == wire.SETTINGS:
            self._settings(flags, stream_id, payload)
        elif kind == wire.WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == wire.PING:
            self._ping(flags, stream_id, payload)
        elif kind == wire.RST_STREAM:
            self.streams.rst_stream(stream_id, payload)
        elif kind == wire.PRIORITY:
            # RFC 9113 drops the priority scheme; the frame is read only to be checked (5.3.2).
            if not payloads.priority(stream_id, payload):
                self.streams.refuse(stream_id, wire.FRAME_SIZE_ERROR)
            self.glitch("PRIORITY frames")
        elif kind == wire.GOAWAY:
            payloads.goaway(stream_id, payload)
            self.streams.going_away = True
        elif kind == wire.PUSH_PROMISE:
            raise ConnectionFault(wire.PROTOCOL_ERROR, "clients may not push")
        else:  # unknown frame types are ignored, as RFC 9113 (5.5) asks
            self.glitch("frames of unknown types")

    def glitch(self, what: str) -> None:
        """A frame that carries nothing a server needs: a flood of them ends the connection."""
        if not self._glitches.spend():
            raise ConnectionFault(wire.ENHANCE_YOUR_CALM, f"too many {what}")

    def _settings(self, flags: int, stream_id: int, payload: memoryview) -> None:
        pairs = payloads.settings(flags, stream_id, payload)
        if pairs is None:  # an ACK
            return
        initial = None
        for key, value in pairs:
            if key == wire.INITIAL_WINDOW_SIZE:
                initial = value
            elif key == wire.MAX_FRAME_SIZE:
                self.outbound.max_frame = value
            elif key == wire.HEADER_TABLE_SIZE:
                self.outbound.header_blocks.table_size(value)
        # Only the last value of the frame moves the windows: one change per frame at most.
        if initial is not None and not self.outbound.initial_window(initial, self.calls.values()):
            raise ConnectionFault(wire.FLOW_CONTROL_ERROR, "a stream window past 2^31-1")
        self._acknowledge(wire.frame(wire.SETTINGS, wire.ACK, 0))
        if initial is not None:  # after the ACK: the bytes a raised window allows
            self.outbound.send_blocked()

    def _ping(self, flags: int, stream_id: int, payload: memoryview) -> None:
        data = payloads.ping(stream_id, payload)
        if flags & wire.ACK:
            if self._keepalive is not None:
                self._keepalive.ping_acknowledged(data)
        else:
            self._acknowledge(wire.frame(wire.PING, wire.ACK, 0, data))
            if self._keepalive is not None:
                self._keepalive.ping_received()

    def _acknowledge(self, ack: bytes) -> None:
        """Queues a SETTINGS or PING answer; ends the connection once MAX_QUEUED_ACKS wait
        unwritten for a client that does not read (its socket takes none of what we write)."""
        if self.transport.get_write_buffer_size():
            self._queued_acks += 1
            if self._queued_acks > MAX_QUEUED_ACKS:
                reason = f"over {MAX_QUEUED_ACKS} answers queued for a client that does not read"
                raise ConnectionFault(wire.ENHANCE_YOUR_CALM, reason)
        else:
            self._queued_acks = 0
        self.out.append(ack)

    def _window_update(self, stream_id: int, payload: memoryview) -> None:
        increment = payloads.window_increment(stream_id, payload)
        if stream_id == 0:
            self.outbound.window += increment
            if self.outbound.window > wire.MAX_WINDOW:
                raise ConnectionFault(wire.FLOW_CONTROL_ERROR, "connection window past 2^31-1")
            self.outbound.send_blocked()
            return
        self.streams.window_update(stream_id, increment)

    def _headers(self, flags: int, stream_id: int, payload: memoryview) -> None:
        payload = payloads.header_fragment(stream_id, flags, payload)
        if flags & wire.END_HEADERS:
            self._header_block(stream_id, flags, bytes(payload))
        else:
            self._continuation = _PendingBlock(stream_id, flags, bytearray(payload))

    def _continue_headers(self, flags: int, stream_id: int, payload: memoryview) -> None:
        pending = self._continuation
        if pending is None or pending.stream_id != stream_id:
            raise ConnectionFault(wire.PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        pending.continuations += 1
        if pending.continuations > MAX_CONTINUATIONS:
            raise ConnectionFault(wire.ENHANCE_YOUR_CALM, f"a header block in {pending.continuations} frames")
        pending.block.extend(payload)
        if len(pending.block) > MAX_HEADER_BLOCK:
            raise ConnectionFault(wire.ENHANCE_YOUR_CALM, f"a header block over {MAX_HEADER_BLOCK} bytes")
        if flags & wire.END_HEADERS:
            self._continuation = None
            self._header_block(stream_id, pending.flags, bytes(pending.block))
        elif not payload:
            self.glitch("empty CONTINUATION frames")

    def _header_block(self, stream_id: int, flags: int, block: bytes) -> None:
        if len(block) > MAX_HEADER_BLOCK:
            raise ConnectionFault(wire.ENHANCE_YOUR_CALM, f"a header block over {MAX_HEADER_BLOCK} bytes")
        headers = self._decoder.decode(block)  # always: the HPACK table must stay in step
        self.streams.header_block(stream_id, flags, headers)

    def data_sent(self) -> None:
        if self._keepalive is not None:
            self._keepalive.data_sent()

    def write(self, *parts: bytes | memoryview) -> None:
        self.out.extend(parts)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._flush_scheduled = False
        if self.out:
            if not self.transport.is_closing():
                self.transport.writelines(self.out)
            self.out.clear()

    # Ending --------------------------------------------------------------------------------

    def _cancel_calls(self) -> None:
        self._cancel_some(self.streams.take_all())

    def _cancel_some(self, calls: list[Call]) -> None:
        """Cancels a turn's share of `calls`, and the rest in later turns: a connection that goes
        with a thousand calls open does not hold the loop while they all unwind at once."""
        for call in calls[:STREAMS_PER_TURN]:
            call.cancel(None)
        if len(calls) > STREAMS_PER_TURN:
            asyncio.get_running_loop().call_soon(self._cancel_some, calls[STREAMS_PER_TURN:])

    def _go_away(self, reason: str, calm: bool) -> None:
        """GOAWAY for keepalive's reasons: calm (too many pings) closes now, else after the calls."""
        self.streams.going_away = True
        self.write(
            wire.goaway(self.streams.last_stream, wire.ENHANCE_YOUR_CALM if calm else wire.NO_ERROR, reason)
        )
        if calm or not self.calls:
            logger.info("gRPC connection from %s closed: %s", self.peer, reason)
            self.flush()
            self.close()

    def close(self) -> None:
        """Closes once what is written has gone; a client that does not take it within
        FLUSH_SECONDS is dropped."""
        self.transport.close()
        if self._abort_timer is None:
            self._abort_timer = asyncio.get_running_loop().call_later(FLUSH_SECONDS, self.transport.abort)

    def _fail_connection(self, fault: ConnectionFault) -> None:
        """GOAWAY with the fault's code; the calls stop at once and the connection closes (or
        is dropped, where the client does not take what we write)."""
        logger.info("gRPC connection from %s closed: %s", self.peer, fault.reason)
        self._cancel_calls()
        self.out.append(wire.goaway(self.streams.last_stream, fault.code, fault.reason))
        self.flush()
        if self.outbound.paused:
            self.transport.abort()
        else:
            self.close()

    async def shut_down(self, grace: float | None) -> None:
        """GOAWAY, lets the calls in progress finish (at most `grace` seconds), then closes; a
        client that does not take what is left to write within FLUSH_SECONDS is dropped."""
        if not self.transport.is_closing():
            self.streams.going_away = True
            self.write(wire.goaway(self.streams.last_stream, wire.NO_ERROR))
            deadline = asyncio.get_running_loop().time() + (grace if grace is not None else 0.0)
            while self.calls and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.05)
            self._cancel_calls()
            self.flush()
            self.transport.close()
        try:
            await asyncio.wait_for(asyncio.shield(self._closed), FLUSH_SECONDS)
        except TimeoutError:
            self.transport.abort()
            await self._closed
