"""One HTTP/2 connection of the native gRPC server: frames in, calls started, frames out.

Flow control both ways: the client gets its receive windows back as its bytes arrive (a
stream's only once its handler has taken the messages waiting, so that ModelStreamInfer's
in-flight limit holds the client back), and answers wait for the client's windows. Frames the
connection writes while handling one read go out in one write; answers written from handler
tasks are gathered until the loop's next turn.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable
from typing import Any

import grpc

from coreserve.server.frontend_reads import FRONTEND_READS
from coreserve.server.grpc_native import wire
from coreserve.server.grpc_native.calls import Call, CallAborted, refused_call
from coreserve.server.grpc_native.headers import HeaderBlockDecoder
from coreserve.server.grpc_native.keepalive import PING_PAYLOAD, KeepaliveTimers
from coreserve.server.grpc_native.sending import Outbound
from coreserve.server.grpc_native.wire import ConnectionFault
from coreserve.server.grpc_transport import GrpcTransport

logger = logging.getLogger("coreserve.server.grpc")

STREAM_WINDOW = 4 * 1024 * 1024  # what each stream may send ahead of its handler
CONNECTION_WINDOW = 64 * 1024 * 1024
MAX_FRAME_SIZE = 1024 * 1024  # frames we accept: fewer, larger frames for large tensors
MAX_HEADER_LIST = 16 * 1024  # gRPC's own limit on metadata
MAX_HEADER_BLOCK = 64 * 1024  # encoded; a larger block ends the connection before decoding
MAX_CONCURRENT = 1024
STREAMED_DATA = 64 * 1024  # DATA frames this large are handed on before their last byte is in
# --grpc-infer-response-compression-level as zlib's levels
GZIP_LEVELS = {"none": 0, "low": 1, "medium": 6, "high": 9}


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
        self._buffer = bytearray()
        self._preface = False
        self._preface_timer: asyncio.TimerHandle | None = None
        self._decoder = HeaderBlockDecoder()
        self.calls: dict[int, Call] = {}
        self._last_stream = 0
        self._continuation: tuple[int, int, bytearray] | None = None
        # A large DATA frame read as it comes: its stream, flags and the payload bytes still due.
        self._streamed: tuple[int, int] = (0, 0)
        self._streamed_due = 0
        self._received = 0  # connection window we owe the client
        self.outbound = Outbound(self._write, self._stream_done)
        self._out: list[bytes | memoryview] = []
        self._flush_scheduled = False
        self._going_away = False
        self._closed = asyncio.get_running_loop().create_future()

    # asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        address = transport.get_extra_info("peername")
        self.peer = f"ipv4:{address[0]}:{address[1]}" if address else ""
        self._out.append(
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
        self._flush()
        # A client that never says it speaks HTTP/2 is dropped, as gRPC core's handshake timeout does.
        self._preface_timer = asyncio.get_running_loop().call_later(
            self._transport_settings.handshake_timeout_s, self.transport.abort
        )
        self._keepalive = KeepaliveTimers(
            self._transport_settings,
            send_ping=lambda: self._write(wire.frame(wire.PING, 0, 0, PING_PAYLOAD)),
            go_away=self._go_away,
            close=self.transport.close,
            has_calls=lambda: bool(self.calls),
        )

    def connection_lost(self, exc: Exception | None) -> None:
        if self._preface_timer is not None:
            self._preface_timer.cancel()
        if self._keepalive is not None:
            self._keepalive.cancel()
        for call in list(self.calls.values()):
            call.cancel(None)
        self.calls.clear()
        self.outbound.wake_all(closed=True)
        if not self._closed.done():
            self._closed.set_result(None)
        self._on_close(self)

    def pause_writing(self) -> None:
        self.outbound.paused = True

    def resume_writing(self) -> None:
        self.outbound.paused = False
        self.outbound.wake_all()

    def data_received(self, data: bytes) -> None:
        FRONTEND_READS.value += 1
        buffer = self._buffer
        position = 0
        try:
            rest: bytes | memoryview = data
            if self._streamed_due:  # the read buffer is empty: the payload goes on from `data`
                rest = self._stream_data(memoryview(data))
                if not rest:
                    self._flush()
                    return
            buffer += rest
            if not self._preface:
                if len(buffer) < 24:
                    if not wire.PREFACE.startswith(bytes(buffer)):
                        raise ConnectionFault(wire.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                    return
                if buffer[:24] != wire.PREFACE:
                    raise ConnectionFault(wire.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                self._preface = True
                if self._preface_timer is not None:
                    self._preface_timer.cancel()
                position = 24
            size = len(buffer)
            view = memoryview(buffer)  # frames are views; none outlives this read
            while size - position >= 9:
                length = (buffer[position] << 16) | (buffer[position + 1] << 8) | buffer[position + 2]
                if length > MAX_FRAME_SIZE:
                    raise ConnectionFault(wire.FRAME_SIZE_ERROR, f"a frame of {length} bytes")
                if size - position - 9 < length:
                    if (
                        length >= STREAMED_DATA
                        and buffer[position + 3] == wire.DATA
                        and not buffer[position + 4] & wire.PADDED
                        and self._continuation is None
                    ):
                        self._start_streamed_data(buffer, view, position, length)
                        position = size
                    break
                kind = buffer[position + 3]
                flags = buffer[position + 4]
                stream_id = int.from_bytes(buffer[position + 5 : position + 9], "big") & 0x7FFFFFFF
                start = position + 9
                position = start + length
                self._frame(kind, flags, stream_id, view[start:position])
            view.release()
        except ConnectionFault as fault:
            self._fail_connection(fault)
            return
        except Exception:  # a fault of ours: this connection ends, the server goes on
            logger.exception("gRPC connection from %s failed", self.peer)
            self._fail_connection(ConnectionFault(wire.INTERNAL_ERROR, "internal error"))
            return
        del buffer[:position]
        self._flush()

    # Frames --------------------------------------------------------------------------------

    def _start_streamed_data(self, buffer: bytearray, view: memoryview, position: int, length: int) -> None:
        """A large DATA frame only partly read: its payload is handed on as it comes, so that
        its bytes go from the socket's chunks into their message with one copy."""
        flags = buffer[position + 4]
        stream_id = int.from_bytes(buffer[position + 5 : position + 9], "big") & 0x7FFFFFFF
        available = len(buffer) - position - 9
        self._streamed = (stream_id, flags)
        self._streamed_due = length - available
        self._data(flags & ~wire.END_STREAM, stream_id, view[position + 9 :])

    def _stream_data(self, data: memoryview) -> memoryview:
        """Hands on the part of `data` that continues a streamed DATA frame; returns the rest."""
        take = min(self._streamed_due, len(data))
        self._streamed_due -= take
        stream_id, flags = self._streamed
        if self._streamed_due:
            flags &= ~wire.END_STREAM
        self._data(flags, stream_id, data[:take], stable=True)
        return data[take:]

    def _frame(self, kind: int, flags: int, stream_id: int, payload: memoryview) -> None:
        if self._continuation is not None and kind != wire.CONTINUATION:
            raise ConnectionFault(wire.PROTOCOL_ERROR, "a header block interrupted")
        if kind == wire.DATA:
            self._data(flags, stream_id, payload)
        elif kind == wire.HEADERS:
            self._headers(flags, stream_id, payload)
        elif kind == wire.CONTINUATION:
            self._continue_headers(flags, stream_id, payload)
        elif kind == wire.SETTINGS:
            self._settings(flags, stream_id, payload)
        elif kind == wire.WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == wire.PING:
            if stream_id or len(payload) != 8:
                raise ConnectionFault(wire.PROTOCOL_ERROR, "a malformed PING")
            if flags & wire.ACK:
                if self._keepalive is not None:
                    self._keepalive.ping_acknowledged(bytes(payload))
            else:
                self._out.append(wire.frame(wire.PING, wire.ACK, 0, bytes(payload)))
                if self._keepalive is not None:
                    self._keepalive.ping_received()
        elif kind == wire.RST_STREAM:
            if stream_id == 0 or len(payload) != 4:
                raise ConnectionFault(wire.PROTOCOL_ERROR, "a malformed RST_STREAM")
            call = self.calls.pop(stream_id, None)
            if call is not None:
                self.outbound.forget(call)
                call.cancel(None)
        elif kind == wire.GOAWAY:
            self._going_away = True
        elif kind == wire.PUSH_PROMISE:
            raise ConnectionFault(wire.PROTOCOL_ERROR, "clients may not push")
        # PRIORITY and unknown frame types are ignored, as RFC 9113 asks.

    def _settings(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id or len(payload) % 6 or (flags & wire.ACK and payload):
            raise ConnectionFault(
                wire.FRAME_SIZE_ERROR if len(payload) % 6 else wire.PROTOCOL_ERROR, "bad SETTINGS"
            )
        if flags & wire.ACK:
            return
        for offset in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HI", payload, offset)
            if key == wire.INITIAL_WINDOW_SIZE:
                if value > wire.MAX_WINDOW:
                    raise ConnectionFault(wire.FLOW_CONTROL_ERROR, "initial window too large")
                self.outbound.initial_window(value, self.calls.values())
            elif key == wire.MAX_FRAME_SIZE:
                if not wire.DEFAULT_MAX_FRAME <= value <= 2**24 - 1:
                    raise ConnectionFault(wire.PROTOCOL_ERROR, "bad SETTINGS_MAX_FRAME_SIZE")
                self.outbound.max_frame = value
            elif key == wire.HEADER_TABLE_SIZE:
                self.outbound.header_blocks.table_size(value)
        self._out.append(wire.frame(wire.SETTINGS, wire.ACK, 0))
        self.outbound.send_blocked()

    def _window_update(self, stream_id: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise ConnectionFault(wire.FRAME_SIZE_ERROR, "a WINDOW_UPDATE of the wrong size")
        increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if stream_id == 0:
            if increment == 0:
                raise ConnectionFault(wire.PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
            self.outbound.window += increment
            if self.outbound.window > wire.MAX_WINDOW:
                raise ConnectionFault(wire.FLOW_CONTROL_ERROR, "connection window past 2^31-1")
            self.outbound.send_blocked()
            return
        call = self.calls.get(stream_id)
        if call is not None:
            call.send_window += increment
            self.outbound.send_pending(call)

    def _headers(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if flags & wire.PADDED:
            if not payload or payload[0] >= len(payload):
                raise ConnectionFault(wire.PROTOCOL_ERROR, "bad padding")
            payload = payload[1 : len(payload) - payload[0]]
        if flags & wire.PRIORITY_FLAG:
            payload = payload[5:]
        if flags & wire.END_HEADERS:
            self._header_block(stream_id, flags, bytes(payload))
        else:
            self._continuation = (stream_id, flags, bytearray(payload))

    def _continue_headers(self, flags: int, stream_id: int, payload: memoryview) -> None:
        pending = self._continuation
        if pending is None or pending[0] != stream_id:
            raise ConnectionFault(wire.PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        pending[2].extend(payload)
        if len(pending[2]) > MAX_HEADER_BLOCK:
            raise ConnectionFault(wire.ENHANCE_YOUR_CALM, f"a header block over {MAX_HEADER_BLOCK} bytes")
        if flags & wire.END_HEADERS:
            self._continuation = None
            self._header_block(stream_id, pending[1], bytes(pending[2]))

    def _header_block(self, stream_id: int, flags: int, block: bytes) -> None:
        if len(block) > MAX_HEADER_BLOCK:
            raise ConnectionFault(wire.ENHANCE_YOUR_CALM, f"a header block over {MAX_HEADER_BLOCK} bytes")
        headers = self._decoder.decode(block)  # always: the HPACK table must stay in step
        if stream_id in self.calls:  # trailers from the client: gRPC has none
            self._end_input(self.calls[stream_id])
            return
        if stream_id % 2 == 0 or stream_id <= self._last_stream:
            raise ConnectionFault(wire.PROTOCOL_ERROR, f"stream {stream_id} may not open here")
        self._last_stream = stream_id
        if self._going_away or len(self.calls) >= MAX_CONCURRENT:
            self._out.append(wire.rst_stream(stream_id, wire.REFUSED_STREAM))
            return
        refusal = refused_call(headers, self.handlers, MAX_HEADER_LIST)
        if refusal is not None:
            block = self.outbound.header_blocks.literal_block(refusal)
            self._out.append(wire.frame(wire.HEADERS, wire.END_HEADERS | wire.END_STREAM, stream_id, block))
            if not flags & wire.END_STREAM:
                self._out.append(wire.rst_stream(stream_id, wire.NO_ERROR))
            return
        call = Call(self, stream_id, headers, self.handlers[headers.path], self.outbound.initial)
        self.calls[stream_id] = call
        if headers.timeout is not None:
            timeout = wire.parse_timeout(headers.timeout)
            if timeout is not None:
                call.set_deadline(timeout)
        if call.handler.request_streaming:
            call.start()
        if flags & wire.END_STREAM:
            self._end_input(call)

    def _data(self, flags: int, stream_id: int, payload: memoryview, stable: bool = False) -> None:
        if stream_id == 0:
            raise ConnectionFault(wire.PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        self._received += size
        if self._received > CONNECTION_WINDOW:
            raise ConnectionFault(wire.FLOW_CONTROL_ERROR, "the client overran the connection window")
        if self._received >= CONNECTION_WINDOW // 4:
            self._out.append(wire.window_update(0, self._received))
            self._received = 0
        if flags & wire.PADDED:
            if not payload or payload[0] >= size:
                raise ConnectionFault(wire.PROTOCOL_ERROR, "bad padding")
            payload = payload[1 : size - payload[0]]
        call = self.calls.get(stream_id)
        if call is None or call.half_closed or call.status is not None:
            if stream_id > self._last_stream:
                raise ConnectionFault(wire.PROTOCOL_ERROR, f"DATA on idle stream {stream_id}")
            return  # a stream we ended or reset: its window came back with the connection's
        call.unacked += size
        if call.unacked > STREAM_WINDOW:
            self._reset(call, wire.FLOW_CONTROL_ERROR)
            return
        try:
            call.receive(payload, self.max_message_size, stable)
        except CallAborted as refusal:
            # A fresh status: the raised one's traceback holds views of the read buffer.
            call.cancel(CallAborted(refusal.code, refusal.details))
            return
        if len(call.messages) < 2:
            self.consumed(call)
        if flags & wire.END_STREAM:
            self._end_input(call)

    def _end_input(self, call: Call) -> None:
        call.close_input()
        if call.task is None and not call.finished:
            call.start()

    def consumed(self, call: Call) -> None:
        """The handler took messages: gives the stream's window back unless many still wait."""
        if call.unacked >= STREAM_WINDOW // 4 and len(call.messages) < 2 and not call.half_closed:
            self._write(wire.window_update(call.stream_id, call.unacked))
            call.unacked = 0

    def _reset(self, call: Call, code: int) -> None:
        self.calls.pop(call.stream_id, None)
        self.outbound.forget(call)
        call.cancel(None)
        self._out.append(wire.rst_stream(call.stream_id, code))

    def _stream_done(self, call: Call) -> None:
        """Our END_STREAM went out for `call`."""
        del self.calls[call.stream_id]
        if not call.half_closed:  # the client may still be sending: it need not
            self._write(wire.rst_stream(call.stream_id, wire.NO_ERROR))
        if self._going_away and not self.calls:  # GOAWAY sent, the last call answered
            self._flush()
            self.transport.close()
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

    def _go_away(self, reason: str, calm: bool) -> None:
        """GOAWAY for keepalive's reasons: calm (too many pings) closes now, else after the calls."""
        self._going_away = True
        self._write(wire.goaway(self._last_stream, wire.ENHANCE_YOUR_CALM if calm else wire.NO_ERROR, reason))
        if calm or not self.calls:
            logger.info("gRPC connection from %s closed: %s", self.peer, reason)
            self._flush()
            self.transport.close()

    def _fail_connection(self, fault: ConnectionFault) -> None:
        logger.info("gRPC connection from %s closed: %s", self.peer, fault.reason)
        self._out.append(wire.goaway(self._last_stream, fault.code, fault.reason))
        self._flush()
        self.transport.close()

    async def shut_down(self, grace: float | None) -> None:
        """GOAWAY, lets the calls in progress finish (at most `grace` seconds), then closes."""
        if self.transport.is_closing():
            return
        self._going_away = True
        self._write(wire.goaway(self._last_stream, wire.NO_ERROR))
        deadline = asyncio.get_running_loop().time() + (grace if grace is not None else 0.0)
        while self.calls and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        for call in list(self.calls.values()):
            call.cancel(None)
        self._flush()
        self.transport.close()
        await self._closed
