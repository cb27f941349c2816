"""The streams of one native gRPC connection: calls opened by header blocks, fed by DATA,
ended by the client's END_STREAM or RST_STREAM, and the windows the client sends under.

A stream's receive window comes back only once its handler has taken the messages waiting
(`consumed`), so that ModelStreamInfer's in-flight limit holds the client back. Handlers start
once a turn's frames are all read (`start_calls`): a call the client resets in the same read
(rapid reset) costs no task. Streams reset before their answer, and streams refused past
MAX_CONCURRENT, spend the connection's stream churn budget.
"""

from __future__ import annotations

from typing import Protocol

import grpc

from coreserve.server.grpc.native._call_status import CallAborted
from coreserve.server.grpc.native._calls import Call, CallConnection, refused_call
from coreserve.server.grpc.native._limits import (
    CONNECTION_WINDOW,
    MAX_CONCURRENT,
    MAX_HEADER_LIST,
    STREAM_CHURN_BURST,
    STREAM_CHURN_RATE,
    STREAM_WINDOW,
    RateBudget,
)
from coreserve.server.grpc.native.frames import _payloads as payloads
from coreserve.server.grpc.native.frames import _wire as wire
from coreserve.server.grpc.native.frames._wire import ConnectionFault
from coreserve.server.grpc.native.headers._request import RequestHeaders


class StreamsConnection(CallConnection, Protocol):
    """What the streams ask of their connection (`_connection.Http2Connection` is the one),
    besides what their calls ask: the frames of the turn, writes, its glitch budget, its end."""

    @property
    def out(self) -> list[bytes | memoryview]: ...

    def glitch(self, what: str) -> None: ...

    def write(self, *parts: bytes | memoryview) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


class Streams:
    """The calls of one connection by stream, and what the client's stream frames do to them.

    Its connection owns it and hands it each stream frame; it answers through the connection's
    frames of the turn (`connection.out`), its writes (`connection.write`) and its answers
    under flow control (`connection.outbound`), and spends the connection's glitch budget.
    """

    def __init__(
        self, connection: StreamsConnection, handlers: dict[str, grpc.RpcMethodHandler], max_message_size: int
    ) -> None:
        self._connection = connection
        self.handlers = handlers
        self.max_message_size = max_message_size
        self.calls: dict[int, Call] = {}
        self.last_stream = 0
        self.going_away = False  # GOAWAY received or sent: new streams are refused
        self._received = 0  # connection window we owe the client
        self._churn_budget = RateBudget(STREAM_CHURN_BURST, STREAM_CHURN_RATE)
        self._starting: list[Call] = []  # calls whose handlers start once this turn's frames are read

    def header_block(self, stream_id: int, flags: int, headers: RequestHeaders) -> None:
        """A stream's decoded header block: a new call's request headers, or a call's trailers."""
        connection = self._connection
        call = self.calls.get(stream_id)
        if call is not None:  # trailers: they end the client's side, with no pseudo-header
            if call.half_closed:
                self.reset(call, wire.STREAM_CLOSED)  # RFC 9113 5.1: the client's side is closed
            elif not flags & wire.END_STREAM or headers.malformed or headers.has_pseudo:
                self.reset(call, wire.PROTOCOL_ERROR)  # RFC 9113 8.1: malformed trailers
            else:
                self._end_input(call)
            return
        if stream_id % 2 == 0:
            raise ConnectionFault(wire.PROTOCOL_ERROR, f"stream {stream_id} may not open here")
        if stream_id <= self.last_stream:  # RFC 9113 5.1.1, as Go's x/net/http2 answers it
            message = f"HEADERS on stream {stream_id}, not above the last opened ({self.last_stream})"
            raise ConnectionFault(wire.PROTOCOL_ERROR, message)
        self.last_stream = stream_id
        if self.going_away or len(self.calls) >= MAX_CONCURRENT:
            connection.out.append(wire.rst_stream(stream_id, wire.REFUSED_STREAM))
            if not self.going_away:
                self._churn()
            return
        if headers.size <= MAX_HEADER_LIST and (headers.malformed or not headers.pseudo_complete):
            self.refuse(stream_id, wire.PROTOCOL_ERROR)
            connection.glitch("malformed requests")
            return
        refusal = refused_call(headers, self.handlers, MAX_HEADER_LIST)
        if refusal is not None:
            block = connection.outbound.header_blocks.literal_block(refusal)
            connection.out.append(
                wire.frame(wire.HEADERS, wire.END_HEADERS | wire.END_STREAM, stream_id, block)
            )
            if not flags & wire.END_STREAM:
                connection.out.append(wire.rst_stream(stream_id, wire.NO_ERROR))
            return
        call = Call(connection, stream_id, headers, self.handlers[headers.path])
        self.calls[stream_id] = call
        if headers.timeout is not None:
            timeout = wire.parse_timeout(headers.timeout)
            if timeout is not None:
                call.set_deadline(timeout)
        if call.handler.request_streaming:
            self._starting.append(call)
        if flags & wire.END_STREAM:
            self._end_input(call)

    def data(self, flags: int, stream_id: int, payload: memoryview, stable: bool) -> None:
        if stream_id == 0:
            raise ConnectionFault(wire.PROTOCOL_ERROR, "DATA on stream 0")
        connection = self._connection
        size = len(payload)
        self._received += size
        if self._received > CONNECTION_WINDOW:
            raise ConnectionFault(wire.FLOW_CONTROL_ERROR, "the client overran the connection window")
        if self._received >= CONNECTION_WINDOW // 4:
            connection.out.append(wire.window_update(0, self._received))
            self._received = 0
        if flags & wire.PADDED:
            payload = payloads.unpadded(flags, payload)
        call = self.calls.get(stream_id)
        if call is None or call.status is not None:
            self.idle(stream_id, "DATA")
            if not payload:
                connection.glitch("empty DATA frames")
            return  # a stream we ended or reset: its window came back with the connection's
        if call.half_closed:
            self.reset(call, wire.STREAM_CLOSED)  # RFC 9113 5.1: the client's side is closed
            return
        if not payload and not flags & wire.END_STREAM:
            connection.glitch("empty DATA frames")
        call.unacked += size
        if call.unacked > STREAM_WINDOW:
            self.reset(call, wire.FLOW_CONTROL_ERROR)
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

    def rst_stream(self, stream_id: int, payload: memoryview) -> None:
        payloads.rst_stream(stream_id, payload)
        self.idle(stream_id, "RST_STREAM")
        call = self.calls.pop(stream_id, None)
        if call is None:
            self._connection.glitch("frames on closed streams")  # one may cross our end; floods may not
            return
        self._connection.outbound.forget(call)
        call.cancel(None)
        self._churn()

    def window_update(self, stream_id: int, increment: int) -> None:
        """A WINDOW_UPDATE on a stream (the connection's own window is the connection's)."""
        self.idle(stream_id, "WINDOW_UPDATE")
        call = self.calls.get(stream_id)
        if call is None:  # a stream that ended: the update may have crossed our end
            self._connection.glitch("frames on closed streams")
            return
        if increment == 0:
            self.reset(call, wire.PROTOCOL_ERROR)
        elif not self._connection.outbound.grant(call, increment):
            self.reset(call, wire.FLOW_CONTROL_ERROR)

    def idle(self, stream_id: int, kind: str) -> None:
        """RFC 9113 5.1: a frame other than HEADERS and PRIORITY on a stream never opened."""
        if stream_id > self.last_stream:
            raise ConnectionFault(wire.PROTOCOL_ERROR, f"{kind} on idle stream {stream_id}")

    def refuse(self, stream_id: int, code: int) -> None:
        """A stream error (RFC 9113 5.4.2) on `stream_id`, open or not."""
        call = self.calls.get(stream_id)
        if call is not None:
            self.reset(call, code)
        else:
            self._connection.out.append(wire.rst_stream(stream_id, code))

    def reset(self, call: Call, code: int) -> None:
        self.calls.pop(call.stream_id, None)
        self._connection.outbound.forget(call)
        call.cancel(None)
        self._connection.out.append(wire.rst_stream(call.stream_id, code))

    def consumed(self, call: Call) -> None:
        """The handler took messages: gives the stream's window back unless many still wait."""
        if call.unacked >= STREAM_WINDOW // 4 and len(call.messages) < 2 and not call.half_closed:
            self._connection.write(wire.window_update(call.stream_id, call.unacked))
            call.unacked = 0

    def start_calls(self) -> None:
        """Starts the handlers of the calls this turn's frames made ready, once all its frames
        are handled: a call the client reset meanwhile (rapid reset) costs no task at all."""
        if not self._starting:
            return
        starting, self._starting = self._starting, []
        for call in starting:
            if call.task is None and not call.reset and not call.finished:
                call.start()

    def stream_done(self, call: Call) -> None:
        """Our END_STREAM went out for `call`."""
        connection = self._connection
        del self.calls[call.stream_id]
        if not call.half_closed:  # the client may still be sending: it need not
            connection.write(wire.rst_stream(call.stream_id, wire.NO_ERROR))
        if self.going_away and not self.calls:  # GOAWAY sent, the last call answered
            connection.flush()
            connection.close()
        elif not self.calls:
            # No other call of this connection can join this answer in one write: it goes now,
            # not one turn of the loop later.
            connection.flush()

    def take_all(self) -> list[Call]:
        """Every call of the connection, which forgets them (the connection is ending)."""
        calls = list(self.calls.values())
        self.calls.clear()
        self._starting.clear()
        return calls

    def _end_input(self, call: Call) -> None:
        call.close_input()
        if call.task is None and not call.finished:
            self._starting.append(call)

    def _churn(self) -> None:
        """A stream reset before its answer, or refused: a client that makes streams only to drop
        them (rapid reset) ends its connection."""
        if not self._churn_budget.spend():
            raise ConnectionFault(wire.ENHANCE_YOUR_CALM, "too many streams reset or refused")
