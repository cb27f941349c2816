"""RFC 9113's rules for the layout of each frame a client sends (section 6), as pure functions.

Each reads one frame's payload, checks its size, its stream and its values, and returns what
the connection needs of it; a frame that breaks a rule raises ConnectionFault with the code the
RFC names. What a frame means for the streams (section 5) is the connection's business.
"""

from __future__ import annotations

import struct

from coreserve.server.grpc.native._limits import MAX_SETTINGS
from coreserve.server.grpc.native.frames import _wire as wire
from coreserve.server.grpc.native.frames._wire import ConnectionFault

_SETTING = struct.Struct(">HI")


def settings(flags: int, stream_id: int, payload: memoryview) -> list[tuple[int, int]] | None:
    """A SETTINGS frame's (identifier, value) pairs in their order; None for an ACK (6.5)."""
    if stream_id:
        raise ConnectionFault(wire.PROTOCOL_ERROR, "SETTINGS on a stream")
    if len(payload) % 6 or (flags & wire.ACK and payload):
        raise ConnectionFault(wire.FRAME_SIZE_ERROR, "a SETTINGS frame of the wrong size")
    if flags & wire.ACK:
        return None
    if len(payload) > 6 * MAX_SETTINGS:  # nghttp2's bound on the work one frame asks for
        raise ConnectionFault(wire.ENHANCE_YOUR_CALM, f"more than {MAX_SETTINGS} settings in a frame")
    pairs = [_SETTING.unpack_from(payload, offset) for offset in range(0, len(payload), 6)]
    for key, value in pairs:  # 6.5.2
        if key == wire.INITIAL_WINDOW_SIZE and value > wire.MAX_WINDOW:
            raise ConnectionFault(wire.FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE past 2^31-1")
        if key == wire.MAX_FRAME_SIZE and not wire.DEFAULT_MAX_FRAME <= value <= 2**24 - 1:
            raise ConnectionFault(wire.PROTOCOL_ERROR, "SETTINGS_MAX_FRAME_SIZE out of range")
        if key == wire.ENABLE_PUSH and value > 1:
            raise ConnectionFault(wire.PROTOCOL_ERROR, "SETTINGS_ENABLE_PUSH other than 0 or 1")
    return pairs


def ping(stream_id: int, payload: memoryview) -> bytes:
    """A PING's 8 bytes (6.7)."""
    if stream_id:
        raise ConnectionFault(wire.PROTOCOL_ERROR, "PING on a stream")
    if len(payload) != 8:
        raise ConnectionFault(wire.FRAME_SIZE_ERROR, "a PING of the wrong size")
    return bytes(payload)


def rst_stream(stream_id: int, payload: memoryview) -> None:
    """Checks a RST_STREAM (6.4)."""
    if stream_id == 0:
        raise ConnectionFault(wire.PROTOCOL_ERROR, "RST_STREAM on stream 0")
    if len(payload) != 4:
        raise ConnectionFault(wire.FRAME_SIZE_ERROR, "a RST_STREAM of the wrong size")


def window_increment(stream_id: int, payload: memoryview) -> int:
    """A WINDOW_UPDATE's increment (6.9); 0 is refused here on the connection only, since on a
    stream it is a stream error."""
    if len(payload) != 4:
        raise ConnectionFault(wire.FRAME_SIZE_ERROR, "a WINDOW_UPDATE of the wrong size")
    increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
    if increment == 0 and stream_id == 0:
        raise ConnectionFault(wire.PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
    return increment


def priority(stream_id: int, payload: memoryview) -> bool:
    """Whether a PRIORITY frame has its 5 bytes (6.3: else a stream error); on stream 0 it is a
    connection error."""
    if stream_id == 0:
        raise ConnectionFault(wire.PROTOCOL_ERROR, "PRIORITY on stream 0")
    return len(payload) == 5


def goaway(stream_id: int, payload: memoryview) -> None:
    """Checks a GOAWAY (6.8)."""
    if stream_id:
        raise ConnectionFault(wire.PROTOCOL_ERROR, "GOAWAY on a stream")
    if len(payload) < 8:
        raise ConnectionFault(wire.FRAME_SIZE_ERROR, "a GOAWAY of the wrong size")


def unpadded(flags: int, payload: memoryview) -> memoryview:
    """A DATA or HEADERS payload without its padding (6.1, 6.2)."""
    if not flags & wire.PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise ConnectionFault(wire.PROTOCOL_ERROR, "padding as long as its frame")
    return payload[1 : len(payload) - payload[0]]


def header_fragment(stream_id: int, flags: int, payload: memoryview) -> memoryview:
    """The header block fragment of a HEADERS frame: without padding and priority (6.2)."""
    if stream_id == 0:
        raise ConnectionFault(wire.PROTOCOL_ERROR, "HEADERS on stream 0")
    payload = unpadded(flags, payload)
    if flags & wire.PRIORITY_FLAG:
        if len(payload) < 5:
            raise ConnectionFault(wire.FRAME_SIZE_ERROR, "HEADERS too short for its priority")
        payload = payload[5:]
    return payload
