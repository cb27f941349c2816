"""One HTTP/2 connection of the native gRPC server: frames in, calls started, frames out.

Flow control both ways: the client gets its receive windows back as its bytes arrive (a
stream's only once its handler has taken the messages waiting, so that ModelStreamInfer's
in-flight limit holds the client back), and answers wait for the client's windows. Frames the
connection writes while handling one read go out in one write; answers written from handler
tasks are gathered until the loop's next turn.

A client that does not take what the server writes is not read from until it does (so PINGs
and SETTINGS, whose answers it would leave unread, cannot pile them up), and one turn of the
event loop reads a bounded number of a connection's frames and new streams (`_limits`). Frames
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
from coreserve.server.grpc.native import _frame_layout, _frames
from coreserve.server.grpc.native._call_status import CallAborted
from coreserve.server.grpc.native._calls import Call, refused_call
from coreserve.server.grpc.native._frame_reader import FrameReader
from coreserve.server.grpc.native._frames import ConnectionFault
from coreserve.server.grpc.native._headers import HeaderBlockDecoder
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
    STREAM_CHURN_BURST,
    STREAM_CHURN_RATE,
    STREAM_WINDOW,
    STREAMS_PER_TURN,
    RateBudget,
)
from coreserve.server.grpc.native._sending import Outbound

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
    ) -> None:
        self.handlers = handlers
        self._transport_settings = settings
        self.gzip_level = GZIP_LEVELS[settings.compression_level]
        self._keepalive: KeepaliveTimers | None = None
        self.max_message_size = max_message_size
        self._on_close = on_close
        self.transport: Any = None
        self.peer = ""
        self._reader = FrameReader(self._frame, self._data, lambda: self._continuation is not None)
        self._preface_timer: asyncio.TimerHandle | None = None
        self._decoder = HeaderBlockDecoder(MAX_HEADER_LIST)
        self.calls: dict[int, Call] = {}
        self._last_stream = 0
        self._continuation: _PendingBlock | None = None
        self._received = 0  # connection window we owe the client
        self.outbound = Outbound(self._write, self._stream_done)
        self._out: list[bytes | memoryview] = []
        self._flush_scheduled = False
        self._going_away = False
        self._closed = asyncio.get_running_loop().create_future()
        self._stream_churn = RateBudget(STREAM_CHURN_BURST, STREAM_CHURN_RATE)
        self._glitches = RateBudget(GLITCH_BURST, GLITCH_RATE)
        self._reading = True  # the transport reads (see _read_on)
        self._abort_timer: asyncio.TimerHandle | None = None  # see _close
        self._turn_scheduled = False
        self._starting: list[Call] = []  # calls whose handlers start once this turn's frames are read

    # asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        address = transport.get_extra_info("peername")
        self.peer = f"ipv4:{address[0]}:{address[1]}" if address else ""
        self._out.append(
            _frames.settings_frame(
                {
                    _frames.MAX_CONCURRENT_STREAMS: MAX_CONCURRENT,
                    _frames.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
                    _frames.MAX_FRAME_SIZE: MAX_FRAME_SIZE,
                    _frames.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST,
                }
            )
            + _frames.window_update(0, CONNECTION_WINDOW - _frames.DEFAULT_WINDOW)
        )
        self._flush()
        # A client that never says it speaks HTTP/2 is dropped, as gRPC core's handshake timeout does.
        self._preface_timer = asyncio.get_running_loop().call_later(
            self._transport_settings.handshake_timeout_s, self.transport.abort
        )
        self._keepalive = KeepaliveTimers(
            self._transport_settings,
            send_ping=lambda: self._write(_frames.frame(_frames.PING, 0, 0, PING_PAYLOAD)),
            go_away=self._go_away,
            close=self._close,
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
        """Reads the frames a former turn left in the buffer (see `_frame_reader`)."""
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
            self._fail_connection(ConnectionFault(_frames.INTERNAL_ERROR, "internal error"))
            return
        if self._starting:
            self._start_calls()
        if self._preface_timer is not None and self._reader.preface_seen:
            self._preface_timer.cancel()
            self._preface_timer = None
        self._flush()
        backlog = self._reader.backlog
        if backlog and not self.outbound.paused:
            self._schedule_turn()
        self._read_on(not backlog and not self.outbound.paused)

    # Frames --------------------------------------------------------------------------------

    def _frame(self, kind: int, flags: int, stream_id: int, payload: memoryview) -> None:
        if self._continuation is not None and kind != _frames.CONTINUATION:
            raise ConnectionFault(_frames.PROTOCOL_ERROR, "a header block interrupted")
        if kind == _frames.DATA:
            self._data(flags, stream_id, payload, False)
        elif kind == _frames.HEADERS:
            self._headers(flags, stream_id, payload)
        elif kind == _frames.CONTINUATION:
            self._continue_headers(flags, stream_id, payload)
        elif kind == _frames.SETTINGS:
            self._settings(flags, stream_id, payload)
        elif kind == _frames.WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == _frames.PING:
            self._ping(flags, stream_id, payload)
        elif kind == _frames.RST_STREAM:
            self._rst_stream(stream_id, payload)
        elif kind == _frames.PRIORITY:
            # RFC 9113 drops the priority scheme; the frame is read only to be checked (5.3.2).
            if not _frame_layout.priority(stream_id, payload):
                self._refuse_stream(stream_id, _frames.FRAME_SIZE_ERROR)
            self._glitch("PRIORITY frames")
        elif kind == _frames.GOAWAY:
            _frame_layout.goaway(stream_id, payload)
            self._going_away = True
        elif kind == _frames.PUSH_PROMISE:
            raise ConnectionFault(_frames.PROTOCOL_ERROR, "clients may not push")
        else:  # unknown frame types are ignored, as RFC 9113 (5.5) asks
            self._glitch("frames of unknown types")

    def _glitch(self, what: str) -> None:
        """A frame that carries nothing a server needs: a flood of them ends the connection."""
        if not self._glitches.spend():
            raise ConnectionFault(_frames.ENHANCE_YOUR_CALM, f"too many {what}")

    def _settings(self, flags: int, stream_id: int, payload: memoryview) -> None:
        pairs = _frame_layout.settings(flags, stream_id, payload)
        if pairs is None:  # an ACK
            return
        initial = None
        for key, value in pairs:
            if key == _frames.INITIAL_WINDOW_SIZE:
                initial = value
            elif key == _frames.MAX_FRAME_SIZE:
                self.outbound.max_frame = value
            elif key == _frames.HEADER_TABLE_SIZE:
                self.outbound.header_blocks.table_size(value)
        # Only the last value of the frame moves the windows: one change per frame at most.
        if initial is not None and not self.outbound.initial_window(initial, self.calls.values()):
            raise ConnectionFault(_frames.FLOW_CONTROL_ERROR, "a stream window past 2^31-1")
        self._out.append(_frames.frame(_frames.SETTINGS, _frames.ACK, 0))

    def _ping(self, flags: int, stream_id: int, payload: memoryview) -> None:
        data = _frame_layout.ping(stream_id, payload)
        if flags & _frames.ACK:
            if self._keepalive is not None:
                self._keepalive.ping_acknowledged(data)
        else:
            self._out.append(_frames.frame(_frames.PING, _frames.ACK, 0, data))
            if self._keepalive is not None:
                self._keepalive.ping_received()

    def _rst_stream(self, stream_id: int, payload: memoryview) -> None:
        _frame_layout.rst_stream(stream_id, payload)
        self._idle(stream_id, "RST_STREAM")
        call = self.calls.pop(stream_id, None)
        if call is None:
            self._glitch("frames on closed streams")  # one may cross our end; floods may not
            return
        self.outbound.forget(call)
        call.cancel(None)
        self._churn()

    def _churn(self) -> None:
        """A stream reset before its answer, or refused: a client that makes streams only to drop
        them (rapid reset) ends its connection."""
        if not self._stream_churn.spend():
            raise ConnectionFault(_frames.ENHANCE_YOUR_CALM, "too many streams reset or refused")

    def _idle(self, stream_id: int, kind: str) -> None:
        """RFC 9113 5.1: a frame other than HEADERS and PRIORITY on a stream never opened."""
        if stream_id > self._last_stream:
            raise ConnectionFault(_frames.PROTOCOL_ERROR, f"{kind} on idle stream {stream_id}")

    def _window_update(self, stream_id: int, payload: memoryview) -> None:
        increment = _frame_layout.window_increment(stream_id, payload)
        if stream_id == 0:
            self.outbound.window += increment
            if self.outbound.window > _frames.MAX_WINDOW:
                raise ConnectionFault(_frames.FLOW_CONTROL_ERROR, "connection window past 2^31-1")
            self.outbound.send_blocked()
            return
        self._idle(stream_id, "WINDOW_UPDATE")
        call = self.calls.get(stream_id)
        if call is None:  # a stream that ended: the update may have crossed our end
            self._glitch("frames on closed streams")
            return
        if increment == 0:
            self._reset(call, _frames.PROTOCOL_ERROR)
        elif not self.outbound.grant(call, increment):
            self._reset(call, _frames.FLOW_CONTROL_ERROR)

    def _headers(self, flags: int, stream_id: int, payload: memoryview) -> None:
        payload = _frame_layout.header_fragment(stream_id, flags, payload)
        if flags & _frames.END_HEADERS:
            self._header_block(stream_id, flags, bytes(payload))
        else:
            self._continuation = _PendingBlock(stream_id, flags, bytearray(payload))

    def _continue_headers(self, flags: int, stream_id: int, payload: memoryview) -> None:
        pending = self._continuation
        if pending is None or pending.stream_id != stream_id:
            raise ConnectionFault(_frames.PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        pending.continuations += 1
        if pending.continuations > MAX_CONTINUATIONS:
            raise ConnectionFault(
                _frames.ENHANCE_YOUR_CALM, f"a header block in {pending.continuations} frames"
            )
        pending.block.extend(payload)
        if len(pending.block) > MAX_HEADER_BLOCK:
            raise ConnectionFault(_frames.ENHANCE_YOUR_CALM, f"a header block over {MAX_HEADER_BLOCK} bytes")
        if flags & _frames.END_HEADERS:
            self._continuation = None
            self._header_block(stream_id, pending.flags, bytes(pending.block))
        elif not payload:
            self._glitch("empty CONTINUATION frames")

    def _header_block(self, stream_id: int, flags: int, block: bytes) -> None:
        if len(block) > MAX_HEADER_BLOCK:
            raise ConnectionFault(_frames.ENHANCE_YOUR_CALM, f"a header block over {MAX_HEADER_BLOCK} bytes")
        headers = self._decoder.decode(block)  # always: the HPACK table must stay in step
        call = self.calls.get(stream_id)
        if call is not None:  # trailers: they end the client's side, with no pseudo-header
            if call.half_closed:
                self._reset(call, _frames.STREAM_CLOSED)  # RFC 9113 5.1: the client's side is closed
            elif not flags & _frames.END_STREAM or headers.malformed or headers.has_pseudo:
                self._reset(call, _frames.PROTOCOL_ERROR)  # RFC 9113 8.1: malformed trailers
            else:
                self._end_input(call)
            return
        if stream_id % 2 == 0:
            raise ConnectionFault(_frames.PROTOCOL_ERROR, f"stream {stream_id} may not open here")
        if stream_id <= self._last_stream:
            raise ConnectionFault(_frames.STREAM_CLOSED, f"HEADERS on closed stream {stream_id}")
        self._last_stream = stream_id
        if self._going_away or len(self.calls) >= MAX_CONCURRENT:
            self._out.append(_frames.rst_stream(stream_id, _frames.REFUSED_STREAM))
            if not self._going_away:
                self._churn()
            return
        if headers.size <= MAX_HEADER_LIST and (headers.malformed or not headers.pseudo_complete):
            self._refuse_stream(stream_id, _frames.PROTOCOL_ERROR)
            self._glitch("malformed requests")
            return
        refusal = refused_call(headers, self.handlers, MAX_HEADER_LIST)
        if refusal is not None:
            block = self.outbound.header_blocks.literal_block(refusal)
            self._out.append(
                _frames.frame(_frames.HEADERS, _frames.END_HEADERS | _frames.END_STREAM, stream_id, block)
            )
            if not flags & _frames.END_STREAM:
                self._out.append(_frames.rst_stream(stream_id, _frames.NO_ERROR))
            return
        call = Call(self, stream_id, headers, self.handlers[headers.path])
        self.calls[stream_id] = call
        if headers.timeout is not None:
            timeout = _frames.parse_timeout(headers.timeout)
            if timeout is not None:
                call.set_deadline(timeout)
        if call.handler.request_streaming:
            self._starting.append(call)
        if flags & _frames.END_STREAM:
            self._end_input(call)

    def _refuse_stream(self, stream_id: int, code: int) -> None:
        """A stream error (RFC 9113 5.4.2) on `stream_id`, open or not."""
        call = self.calls.get(stream_id)
        if call is not None:
            self._reset(call, code)
        else:
            self._out.append(_frames.rst_stream(stream_id, code))

    def _data(self, flags: int, stream_id: int, payload: memoryview, stable: bool) -> None:
        if stream_id == 0:
            raise ConnectionFault(_frames.PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        self._received += size
        if self._received > CONNECTION_WINDOW:
            raise ConnectionFault(_frames.FLOW_CONTROL_ERROR, "the client overran the connection window")
        if self._received >= CONNECTION_WINDOW // 4:
            self._out.append(_frames.window_update(0, self._received))
            self._received = 0
        if flags & _frames.PADDED:
            payload = _frame_layout.unpadded(flags, payload)
        call = self.calls.get(stream_id)
        if call is None or call.status is not None:
            self._idle(stream_id, "DATA")
            if not payload:
                self._glitch("empty DATA frames")
            return  # a stream we ended or reset: its window came back with the connection's
        if call.half_closed:
            self._reset(call, _frames.STREAM_CLOSED)  # RFC 9113 5.1: the client's side is closed
            return
        if not payload and not flags & _frames.END_STREAM:
            self._glitch("empty DATA frames")
        call.unacked += size
        if call.unacked > STREAM_WINDOW:
            self._reset(call, _frames.FLOW_CONTROL_ERROR)
            return
        try:
            call.receive(payload, self.max_message_size, stable)
        except CallAborted as refusal:
            # A fresh status: the raised one's traceback holds views of the read buffer.
            call.cancel(CallAborted(refusal.code, refusal.details))
            return
        if len(call.messages) < 2:
            self.consumed(call)
        if flags & _frames.END_STREAM:
            self._end_input(call)

    def _end_input(self, call: Call) -> None:
        call.close_input()
        if call.task is None and not call.finished:
            self._starting.append(call)

    def _start_calls(self) -> None:
        """Starts the handlers of the calls this turn's frames made ready, once all its frames
        are handled: a call the client reset meanwhile (rapid reset) costs no task at all."""
        starting, self._starting = self._starting, []
        for call in starting:
            if call.task is None and not call.reset and not call.finished:
                call.start()

    def consumed(self, call: Call) -> None:
        """The handler took messages: gives the stream's window back unless many still wait."""
        if call.unacked >= STREAM_WINDOW // 4 and len(call.messages) < 2 and not call.half_closed:
            self._write(_frames.window_update(call.stream_id, call.unacked))
            call.unacked = 0

    def _reset(self, call: Call, code: int) -> None:
        self.calls.pop(call.stream_id, None)
        self.outbound.forget(call)
        call.cancel(None)
        self._out.append(_frames.rst_stream(call.stream_id, code))

    def _stream_done(self, call: Call) -> None:
        """Our END_STREAM went out for `call`."""
        del self.calls[call.stream_id]
        if not call.half_closed:  # the client may still be sending: it need not
            self._write(_frames.rst_stream(call.stream_id, _frames.NO_ERROR))
        if self._going_away and not self.calls:  # GOAWAY sent, the last call answered
            self._flush()
            self._close()
        elif not self.calls:
            # No other call of this connection can join this answer in one write: it goes now,
            # not one turn of the loop later.
            self._flush()

    def data_sent(self) -> None:
        if self._keepalive is not None:
            self._keepalive.data_sent()

    def _write(self, *parts: bytes | memoryview) -> None:
        self._out.extend(parts)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._out:
            if not self.transport.is_closing():
                self.transport.writelines(self._out)
            self._out.clear()

    # Ending --------------------------------------------------------------------------------

    def _cancel_calls(self) -> None:
        calls = list(self.calls.values())
        self.calls.clear()
        self._starting.clear()
        self._cancel_some(calls)

    def _cancel_some(self, calls: list[Call]) -> None:
        """Cancels a turn's share of `calls`, and the rest in later turns: a connection that goes
        with a thousand calls open does not hold the loop while they all unwind at once."""
        for call in calls[:STREAMS_PER_TURN]:
            call.cancel(None)
        if len(calls) > STREAMS_PER_TURN:
            asyncio.get_running_loop().call_soon(self._cancel_some, calls[STREAMS_PER_TURN:])

    def _go_away(self, reason: str, calm: bool) -> None:
        """GOAWAY for keepalive's reasons: calm (too many pings) closes now, else after the calls."""
        self._going_away = True
        self._write(
            _frames.goaway(self._last_stream, _frames.ENHANCE_YOUR_CALM if calm else _frames.NO_ERROR, reason)
        )
        if calm or not self.calls:
            logger.info("gRPC connection from %s closed: %s", self.peer, reason)
            self._flush()
            self._close()

    def _close(self) -> None:
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
        self._out.append(_frames.goaway(self._last_stream, fault.code, fault.reason))
        self._flush()
        if self.outbound.paused:
            self.transport.abort()
        else:
            self._close()

    async def shut_down(self, grace: float | None) -> None:
        """GOAWAY, lets the calls in progress finish (at most `grace` seconds), then closes; a
        client that does not take what is left to write within FLUSH_SECONDS is dropped."""
        if not self.transport.is_closing():
            self._going_away = True
            self._write(_frames.goaway(self._last_stream, _frames.NO_ERROR))
            deadline = asyncio.get_running_loop().time() + (grace if grace is not None else 0.0)
            while self.calls and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.05)
            self._cancel_calls()
            self._flush()
            self.transport.close()
        try:
            await asyncio.wait_for(asyncio.shield(self._closed), FLUSH_SECONDS)
        except TimeoutError:
            self.transport.abort()
            await self._closed
