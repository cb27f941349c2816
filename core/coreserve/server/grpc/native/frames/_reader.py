"""The frames in the bytes a native gRPC connection reads: the preface, then whole frames.

A read's frames are handed on as views of the read buffer, a turn's share at a time
(`limits`): what is left waits in the buffer for a later turn, and the connection reads
nothing more from its client meanwhile. A large DATA frame is handed on as its bytes come, so
that they go from the socket's chunks into their message with one copy.
"""

from __future__ import annotations

from collections.abc import Callable

from coreserve.server.grpc.native._limits import (
    FRAMES_PER_TURN,
    HEADER_BYTES_PER_TURN,
    MAX_FRAME_SIZE,
    STREAMS_PER_TURN,
)
from coreserve.server.grpc.native.frames import _wire as wire
from coreserve.server.grpc.native.frames._wire import ConnectionFault

STREAMED_DATA = 64 * 1024  # DATA frames this large are handed on before their last byte is in

# (kind, flags, stream id, payload): one whole frame.
FrameHandler = Callable[[int, int, int, memoryview], None]
# (flags, stream id, payload, stable): DATA bytes; stable where they are not in the read buffer.
DataHandler = Callable[[int, int, memoryview, bool], None]


class FrameReader:
    """One connection's read buffer, cut into frames for `on_frame` (and large DATA frames'
    bytes for `on_data`); `in_header_block()` says whether a header block is still coming,
    during which DATA frames are not streamed (they are an error there)."""

    def __init__(
        self, on_frame: FrameHandler, on_data: DataHandler, in_header_block: Callable[[], bool]
    ) -> None:
        self._on_frame = on_frame
        self._on_data = on_data
        self._in_header_block = in_header_block
        self._buffer = bytearray()
        self.preface_seen = False
        self._settings_due = True  # RFC 9113 3.4: the preface ends with a SETTINGS frame
        self.backlog = False  # whole frames wait in the buffer for a later turn
        # A large DATA frame read as it comes: its stream, flags and the payload bytes still due.
        self._streamed: tuple[int, int] = (0, 0)
        self._streamed_due = 0

    def feed(self, data: bytes) -> None:
        """Takes a read's bytes and hands on the frames they complete, up to a turn's share.
        ConnectionFault where they break HTTP/2."""
        if self._streamed_due:  # the read buffer is empty: the payload goes on from `data`
            rest = self._stream_data(memoryview(data))
            if not rest:
                return
            self._buffer += rest
        else:
            self._buffer += data
        self.next_turn()

    def next_turn(self) -> None:
        """Hands on the whole frames in the buffer, up to a turn's share."""
        buffer = self._buffer
        position = 0
        if not self.preface_seen:
            if len(buffer) < 24:
                if not wire.PREFACE.startswith(bytes(buffer)):
                    raise ConnectionFault(wire.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                return
            if buffer[:24] != wire.PREFACE:
                raise ConnectionFault(wire.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
            self.preface_seen = True
            position = 24
        del buffer[: self._frames(buffer, position)]

    def drop(self) -> None:
        """The connection is gone: nothing it read is kept."""
        self._buffer = bytearray()

    def _frames(self, buffer: bytearray, position: int) -> int:
        """Hands on frames from `position` on, within the turn's share; returns where it stopped."""
        size = len(buffer)
        frames = streams = header_bytes = 0  # this turn's
        self.backlog = False
        if self._settings_due and size - position >= 9:
            if buffer[position + 3] != wire.SETTINGS or buffer[position + 4] & wire.ACK:
                raise ConnectionFault(wire.PROTOCOL_ERROR, "the connection preface ends without SETTINGS")
            self._settings_due = False
        view = memoryview(buffer)  # frames are views; none outlives this read
        on_frame = self._on_frame
        try:
            while size - position >= 9:
                if (
                    frames == FRAMES_PER_TURN
                    or streams == STREAMS_PER_TURN
                    or header_bytes >= HEADER_BYTES_PER_TURN
                ):
                    self.backlog = True
                    break
                length = (buffer[position] << 16) | (buffer[position + 1] << 8) | buffer[position + 2]
                if length > MAX_FRAME_SIZE:
                    raise ConnectionFault(wire.FRAME_SIZE_ERROR, f"a frame of {length} bytes")
                kind = buffer[position + 3]
                if size - position - 9 < length:
                    if (
                        length >= STREAMED_DATA
                        and kind == wire.DATA
                        and not buffer[position + 4] & wire.PADDED
                        and not self._in_header_block()
                    ):
                        self._start_streamed_data(buffer, view, position, length)
                        position = size
                    break
                flags = buffer[position + 4]
                stream_id = int.from_bytes(buffer[position + 5 : position + 9], "big") & 0x7FFFFFFF
                start = position + 9
                position = start + length
                frames += 1
                if kind == wire.HEADERS:  # each opens a stream at most
                    streams += 1
                    header_bytes += length
                elif kind == wire.CONTINUATION:
                    header_bytes += length
                on_frame(kind, flags, stream_id, view[start:position])
        finally:
            view.release()
        return position

    def _start_streamed_data(self, buffer: bytearray, view: memoryview, position: int, length: int) -> None:
        flags = buffer[position + 4]
        stream_id = int.from_bytes(buffer[position + 5 : position + 9], "big") & 0x7FFFFFFF
        available = len(buffer) - position - 9
        self._streamed = (stream_id, flags)
        self._streamed_due = length - available
        if available:  # (none yet: not an empty frame, just its header so far)
            self._on_data(flags & ~wire.END_STREAM, stream_id, view[position + 9 :], False)

    def _stream_data(self, data: memoryview) -> memoryview:
        """Hands on the part of `data` that continues a streamed DATA frame; returns the rest."""
        take = min(self._streamed_due, len(data))
        self._streamed_due -= take
        stream_id, flags = self._streamed
        if self._streamed_due:
            flags &= ~wire.END_STREAM
        self._on_data(flags, stream_id, data[:take], True)
        return data[take:]
