"""HTTP/2 frames and gRPC's header fields as bytes: what the native server writes and parses.

Only the pieces gRPC needs (RFC 9113, RFC 7541 for the header encoding we write, and gRPC's
"gRPC over HTTP2" document). Header fields are written without Huffman codes; the few that go
into the HPACK dynamic table are chosen by `headers.response`, which keeps its state.
"""

from __future__ import annotations

import re
import struct
from urllib.parse import quote

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    range(10)
)
# Flags
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20
# Settings identifiers
HEADER_TABLE_SIZE = 0x1
ENABLE_PUSH = 0x2
MAX_CONCURRENT_STREAMS = 0x3
INITIAL_WINDOW_SIZE = 0x4
MAX_FRAME_SIZE = 0x5
MAX_HEADER_LIST_SIZE = 0x6
# Error codes
NO_ERROR = 0x0
PROTOCOL_ERROR = 0x1
INTERNAL_ERROR = 0x2
FLOW_CONTROL_ERROR = 0x3
STREAM_CLOSED = 0x5
FRAME_SIZE_ERROR = 0x6
REFUSED_STREAM = 0x7
CANCEL = 0x8
COMPRESSION_ERROR = 0x9
ENHANCE_YOUR_CALM = 0xB

DEFAULT_WINDOW = 65535
DEFAULT_MAX_FRAME = 16384
MAX_WINDOW = 2**31 - 1

_FRAME_HEADER = struct.Struct(">HBBBI")


class ConnectionFault(Exception):
    """A peer broke HTTP/2 on the connection: it ends with GOAWAY carrying `code`."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def frame_header(kind: int, flags: int, stream_id: int, length: int) -> bytes:
    """The 9 bytes before a frame's payload."""
    return _FRAME_HEADER.pack(length >> 8, length & 0xFF, kind, flags, stream_id)


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One whole frame."""
    return frame_header(kind, flags, stream_id, len(payload)) + payload


def settings_frame(settings: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", key, value) for key, value in settings.items()))


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, struct.pack(">I", increment))


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream_id, struct.pack(">I", code))


def goaway(last_stream_id: int, code: int, reason: str = "") -> bytes:
    return frame(GOAWAY, 0, 0, struct.pack(">II", last_stream_id, code) + reason.encode()[:256])


def _integer(value: int, prefix_bits: int, first: int) -> bytes:
    """RFC 7541 5.1: an integer with an N-bit prefix; `first`: the high bits of the first byte."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(data: bytes) -> bytes:
    return _integer(len(data), 7, 0) + data


def literal(name: bytes, value: bytes) -> bytes:
    """A header field as a literal without indexing, with a literal name (never Huffman)."""
    return b"\x00" + _string(name) + _string(value)


def literal_indexed(name: bytes, value: bytes) -> bytes:
    """A header field as a literal with incremental indexing (RFC 7541 6.2.1): the decoder adds
    it to its dynamic table."""
    return b"\x40" + _string(name) + _string(value)


def indexed(index: int) -> bytes:
    """A header field named by its index in the static (1-61) or dynamic (62 on) table."""
    return _integer(index, 7, 0x80)


def table_size_update(size: int) -> bytes:
    """A dynamic table size update (RFC 7541 6.3)."""
    return _integer(size, 5, 0x20)


FIRST_DYNAMIC_INDEX = 62  # the newest entry of the dynamic table
DEFAULT_HEADER_TABLE_SIZE = 4096
STATUS_200 = indexed(8)  # ":status: 200", static table entry 8
# ":status: 200" and "content-type: application/grpc" (static name 31), with no indexing.
RESPONSE_HEADERS = STATUS_200 + _integer(31, 4, 0x00) + _string(b"application/grpc")


def status_trailers(code: int, message: str) -> bytes:
    """The trailers of a call that ends with `code` and `message` (percent-encoded, as gRPC asks)."""
    block = literal(b"grpc-status", str(code).encode())
    if message:
        quoted = quote(message, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~", errors="backslashreplace")
        block += literal(b"grpc-message", quoted.encode())
    return block


def http_status(status: int) -> bytes:
    """`:status` for a request that is not gRPC at all (a literal with static name 8)."""
    return b"\x08" + _string(str(status).encode())


_TIMEOUT = re.compile(rb"^(\d{1,8})([HMSmun])$")
_UNIT_SECONDS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}


def parse_timeout(value: bytes) -> float | None:
    """grpc-timeout in seconds ("100m" is 0.1); None when it is not gRPC's format."""
    match = _TIMEOUT.match(value)
    if match is None:
        return None
    return int(match.group(1)) * _UNIT_SECONDS[match.group(2)]
