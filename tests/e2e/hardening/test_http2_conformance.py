"""RFC 9113 (sections 3-6, 8) and RFC 7541 as the native gRPC server must keep them.

Each case opens a connection, sends frames by hand, and checks how the server ends the stream
or the connection: the GOAWAY code of a connection error, the RST_STREAM code of a stream error,
or that the frame is ignored and the connection still serves a call. After every case a real
client's call succeeds and the log holds no traceback.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator

import pytest

from coreserve.testing import ServerProcess
from support.wire.http2_raw import (
    ACK,
    COMPRESSION_ERROR,
    CONTINUATION,
    DATA,
    ENABLE_PUSH,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    MAX_FRAME_SIZE,
    PADDED,
    PING,
    PREFACE,
    PRIORITY,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    RST_STREAM,
    SERVICE,
    SETTINGS,
    STREAM_CLOSED,
    WINDOW_UPDATE,
    RawHttp2,
    assert_identity_answers,
    frame,
    identity_server,
    infer_request,
    message,
    setting,
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = identity_server(tmp_path_factory.mktemp("h2-conformance"))
    yield process
    process.close()


@pytest.fixture(autouse=True)
def _serves_after_and_logs_no_traceback(server: ServerProcess) -> Iterator[None]:
    yield
    assert_identity_answers(server)
    assert "Traceback" not in server.log, server.log[-3000:]


@pytest.fixture
def raw(server: ServerProcess) -> Iterator[RawHttp2]:
    connection = RawHttp2(server)
    yield connection
    connection.close()


def request_headers(raw: RawHttp2, method: str = "ModelInfer", *extra: tuple[str, str]) -> bytes:
    return raw.headers_block(method, *extra)


def infer(raw: RawHttp2, stream_id: int, values: int = 4) -> bytes:
    """A whole ModelInfer call on `stream_id`: HEADERS, then its message with END_STREAM."""
    return frame(HEADERS, END_HEADERS, stream_id, request_headers(raw)) + frame(
        DATA, END_STREAM, stream_id, message(infer_request(values))
    )


def held_call(raw: RawHttp2, stream_id: int = 1) -> None:
    """Opens the connection with a 1-byte stream window and sends a whole call on `stream_id`:
    its answer waits for window, so the stream stays open on the server, half-closed by us."""
    raw.open(setting(INITIAL_WINDOW_SIZE, 1))
    raw.send(infer(raw, stream_id))


def open_stream(raw: RawHttp2, stream_id: int = 1) -> None:
    """Opens the connection and a ModelStreamInfer stream that stays open both ways."""
    raw.open()
    raw.send(frame(HEADERS, END_HEADERS, stream_id, request_headers(raw, "ModelStreamInfer")))


def still_serves(raw: RawHttp2, stream_id: int) -> None:
    """The connection answers a ServerLive call on `stream_id` (given window for it)."""
    raw.send(
        frame(SETTINGS, 0, 0, setting(INITIAL_WINDOW_SIZE, 65535))
        + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 20))
        + frame(HEADERS, END_HEADERS, stream_id, request_headers(raw, "ServerLive"))
        + frame(DATA, END_STREAM, stream_id, message(b""))
    )
    kind, fields = raw.outcome(stream_id)
    assert kind == "answer" and fields["grpc-status"] == "0", (kind, fields)  # type: ignore[index]


# Connection errors: GOAWAY with the code RFC 9113 names ---------------------------------------

Case = Callable[[RawHttp2], None]


def _opened(*frames: bytes) -> Case:
    def send(raw: RawHttp2) -> None:
        raw.open()
        raw.send(b"".join(frames))

    return send


def _after_call(make: Callable[[RawHttp2], bytes]) -> Case:
    """A whole call on stream 1 answered first, then what `make` builds."""

    def send(raw: RawHttp2) -> None:
        raw.open()
        raw.send(infer(raw, 1))
        assert raw.outcome(1)[0] == "answer"
        raw.send(make(raw))

    return send


def _held(*frames: bytes) -> Case:
    def send(raw: RawHttp2) -> None:
        held_call(raw)
        raw.send(b"".join(frames))

    return send


def _connection_window_spent(raw: RawHttp2, initial_window: int = 65535) -> None:
    """Opens the connection and stream 1, whose answer (160 kB) spends the connection's window
    (64 kB): the rest of it waits, and the stream stays open whatever window it is given."""
    raw.open(setting(INITIAL_WINDOW_SIZE, initial_window))
    raw.send(infer(raw, 1, 40_000))
    for kind, _flags, sid, payload in raw.frames():
        if kind == HEADERS:
            raw.decoder.decode(payload)  # its fields enter the client's table
        if kind == DATA and sid == 1:
            return
    raise AssertionError("stream 1's answer did not start")


def _window_overflow_by_settings(raw: RawHttp2) -> None:
    # Nearly 2^31 of window granted to stream 1, whose answer waits for the connection's window;
    # a larger initial window then takes its window past 2^31-1 (RFC 9113 6.9.2).
    _connection_window_spent(raw, initial_window=1)
    raw.send(frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 2**31 - 2)))
    raw.send(frame(SETTINGS, 0, 0, setting(INITIAL_WINDOW_SIZE, 70_000)))


def _window_overflow_by_update(raw: RawHttp2) -> None:
    _connection_window_spent(raw)  # stream 1's window is spent too: 0
    raw.send(frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 2**31 - 1)))  # 2^31-1 exactly
    raw.send(frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 1)))


CONNECTION_ERRORS: dict[str, tuple[Case, int]] = {
    # 3.4: the preface is followed by a SETTINGS frame
    "preface-without-settings": (lambda raw: raw.send(PREFACE + frame(PING, 0, 0, b"12345678")), PROTOCOL_ERROR),
    "preface-with-settings-ack": (lambda raw: raw.send(PREFACE + frame(SETTINGS, ACK, 0)), PROTOCOL_ERROR),
    # 4.2: past our SETTINGS_MAX_FRAME_SIZE (1 MiB)
    "frame-too-large": (_opened(struct.pack(">I", (1 << 20) + 1)[1:] + bytes([DATA, 0, 0, 0, 0, 1])), FRAME_SIZE_ERROR),
    # 4.3: a header block that does not decode
    "hpack-garbage": (_opened(frame(HEADERS, END_HEADERS, 1, b"\xff\xff\xff\xff\x0f")), COMPRESSION_ERROR),
    # 5.1: frames other than HEADERS and PRIORITY on an idle stream
    "data-on-idle-stream": (_opened(frame(DATA, 0, 7, b"abc")), PROTOCOL_ERROR),
    "rst-on-idle-stream": (_opened(frame(RST_STREAM, 0, 7, struct.pack(">I", 8))), PROTOCOL_ERROR),
    "window-update-on-idle-stream": (_opened(frame(WINDOW_UPDATE, 0, 7, struct.pack(">I", 1))), PROTOCOL_ERROR),
    # 5.1.1: a client opens odd streams, each above the last; HEADERS on a stream not above the
    # last one opened (closed, or never opened) is PROTOCOL_ERROR, as Go's x/net/http2 answers
    "headers-on-closed-stream": (_after_call(lambda raw: frame(HEADERS, END_HEADERS | END_STREAM, 1, request_headers(raw))), PROTOCOL_ERROR),
    "even-stream": (_opened(frame(HEADERS, END_HEADERS, 2, b"\x83")), PROTOCOL_ERROR),
    "stream-id-going-back": (_after_call(lambda raw: infer(raw, 3) + infer(raw, 1)), PROTOCOL_ERROR),
    # 5.5: an unknown frame in the middle of a header block
    "unknown-frame-inside-a-header-block": (
        lambda raw: (raw.open(), raw.send(frame(HEADERS, 0, 1, request_headers(raw)[:5]) + frame(0xFA, 0, 0, b""))),  # type: ignore[func-returns-value]
        PROTOCOL_ERROR,
    ),
    # 6.1: DATA on stream 0, padding as long as the frame
    "data-on-stream-0": (_opened(frame(DATA, 0, 0, b"x")), PROTOCOL_ERROR),
    "data-padding-too-long": (_held(frame(DATA, PADDED, 1, b"\x05abc")), PROTOCOL_ERROR),
    # 6.2: HEADERS on stream 0, padding too long, a priority cut short
    "headers-on-stream-0": (_opened(frame(HEADERS, END_HEADERS, 0, b"\x83")), PROTOCOL_ERROR),
    "headers-padding-too-long": (_opened(frame(HEADERS, END_HEADERS | PADDED, 1, b"\x09\x83")), PROTOCOL_ERROR),
    "headers-priority-cut-short": (_opened(frame(HEADERS, END_HEADERS | PRIORITY_FLAG, 1, b"\x00\x00")), FRAME_SIZE_ERROR),
    # 6.3: PRIORITY on stream 0
    "priority-on-stream-0": (_opened(frame(PRIORITY, 0, 0, b"\x00\x00\x00\x01\x10")), PROTOCOL_ERROR),
    # 6.4: RST_STREAM on stream 0, of the wrong size
    "rst-on-stream-0": (_opened(frame(RST_STREAM, 0, 0, struct.pack(">I", 8))), PROTOCOL_ERROR),
    "rst-of-3-bytes": (_held(frame(RST_STREAM, 0, 1, b"\x00\x00\x08")), FRAME_SIZE_ERROR),
    # 6.5: SETTINGS on a stream, ACK with a payload, a length not a multiple of 6, bad values
    "settings-on-a-stream": (_opened(frame(SETTINGS, 0, 1, b"")), PROTOCOL_ERROR),
    "settings-ack-with-payload": (_opened(frame(SETTINGS, ACK, 0, setting(INITIAL_WINDOW_SIZE, 1))), FRAME_SIZE_ERROR),
    "settings-of-4-bytes": (lambda raw: raw.send(PREFACE + frame(SETTINGS, 0, 0, b"\x00\x04\x00\x00")), FRAME_SIZE_ERROR),
    "enable-push-2": (_opened(frame(SETTINGS, 0, 0, setting(ENABLE_PUSH, 2))), PROTOCOL_ERROR),
    "initial-window-2^31": (_opened(frame(SETTINGS, 0, 0, setting(INITIAL_WINDOW_SIZE, 2**31))), FLOW_CONTROL_ERROR),
    "max-frame-size-below-16k": (_opened(frame(SETTINGS, 0, 0, setting(MAX_FRAME_SIZE, 16383))), PROTOCOL_ERROR),
    "max-frame-size-2^24": (_opened(frame(SETTINGS, 0, 0, setting(MAX_FRAME_SIZE, 2**24))), PROTOCOL_ERROR),
    "33-settings-in-a-frame": (_opened(frame(SETTINGS, 0, 0, setting(0x20, 0) * 33)), ENHANCE_YOUR_CALM),
    # 6.6: a client may not push
    "push-promise": (_opened(frame(PUSH_PROMISE, END_HEADERS, 1, b"\x00\x00\x00\x02\x83")), PROTOCOL_ERROR),
    # 6.7: PING of the wrong size, on a stream
    "ping-of-7-bytes": (_opened(frame(PING, 0, 0, b"1234567")), FRAME_SIZE_ERROR),
    "ping-on-a-stream": (_opened(frame(PING, 0, 1, b"12345678")), PROTOCOL_ERROR),
    # 6.8: GOAWAY on a stream
    "goaway-on-a-stream": (_opened(frame(GOAWAY, 0, 1, struct.pack(">II", 0, 0))), PROTOCOL_ERROR),
    # 6.9: WINDOW_UPDATE of 0 or of the wrong size on the connection; windows past 2^31-1
    "window-update-0-on-connection": (_opened(frame(WINDOW_UPDATE, 0, 0, b"\x00\x00\x00\x00")), PROTOCOL_ERROR),
    "window-update-of-3-bytes": (_opened(frame(WINDOW_UPDATE, 0, 0, b"\x00\x00\x01")), FRAME_SIZE_ERROR),
    "connection-window-past-2^31-1": (_opened(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 2**31 - 1))), FLOW_CONTROL_ERROR),
    "stream-window-past-2^31-1-by-settings": (_window_overflow_by_settings, FLOW_CONTROL_ERROR),
    # 6.10: CONTINUATION without HEADERS, on another stream, after END_HEADERS
    "continuation-without-headers": (_opened(frame(CONTINUATION, END_HEADERS, 1, b"\x83")), PROTOCOL_ERROR),
    "continuation-on-another-stream": (
        lambda raw: (raw.open(), raw.send(frame(HEADERS, 0, 1, request_headers(raw)[:5]) + frame(CONTINUATION, END_HEADERS, 3, b""))),  # type: ignore[func-returns-value]
        PROTOCOL_ERROR,
    ),
    "continuation-after-end-headers": (_after_call(lambda raw: frame(CONTINUATION, END_HEADERS, 1, b"\x83")), PROTOCOL_ERROR),
    # RFC 7541 4.2 / 6.3: a table size update past SETTINGS_HEADER_TABLE_SIZE (4096)
    "hpack-table-size-past-setting": (_opened(frame(HEADERS, END_HEADERS, 1, b"\x3f\xe2\x1f\x83")), COMPRESSION_ERROR),
    "hpack-table-size-after-a-field": (_opened(frame(HEADERS, END_HEADERS, 1, b"\x83\x20")), COMPRESSION_ERROR),
    "hpack-index-0": (_opened(frame(HEADERS, END_HEADERS, 1, b"\x80")), COMPRESSION_ERROR),
}  # fmt: skip


@pytest.mark.parametrize("case", CONNECTION_ERRORS, ids=list(CONNECTION_ERRORS))
def test_connection_errors_get_goaway_with_the_rfc_code(raw: RawHttp2, case: str) -> None:
    send, code = CONNECTION_ERRORS[case]
    send(raw)
    assert raw.goaway_code() == code


# Stream errors: RST_STREAM with the code RFC 9113 names, the connection serves on --------------

STREAM_ERRORS: dict[str, tuple[Case, int]] = {
    # 5.1: DATA or HEADERS from the client after its END_STREAM (half-closed, remote)
    "data-after-end-stream": (_held(frame(DATA, 0, 1, message(b""))), STREAM_CLOSED),
    "headers-after-end-stream": (_held(frame(HEADERS, END_HEADERS | END_STREAM, 1, b"")), STREAM_CLOSED),
    # 6.3: PRIORITY of the wrong size
    "priority-of-4-bytes": (_held(frame(PRIORITY, 0, 1, b"\x00\x00\x00\x03")), FRAME_SIZE_ERROR),
    # 6.9: WINDOW_UPDATE of 0 on a stream; a stream window past 2^31-1
    "window-update-0-on-stream": (_held(frame(WINDOW_UPDATE, 0, 1, b"\x00\x00\x00\x00")), PROTOCOL_ERROR),
    "stream-window-past-2^31-1": (_window_overflow_by_update, FLOW_CONTROL_ERROR),
    # 8.1: trailers from the client with a pseudo-header, or that do not end the stream
    "trailers-with-a-pseudo-header": (
        lambda raw: (open_stream(raw), raw.send(frame(HEADERS, END_HEADERS | END_STREAM, 1, bytes(raw.encoder.encode([(":path", "/x")]))))),  # type: ignore[func-returns-value]
        PROTOCOL_ERROR,
    ),
    # 8.1: trailers from the client that do not end the stream
    "trailers-without-end-stream": (
        lambda raw: (open_stream(raw), raw.send(frame(HEADERS, END_HEADERS, 1, bytes(raw.encoder.encode([("x-t", "1")])))),),  # type: ignore[func-returns-value]
        PROTOCOL_ERROR,
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", STREAM_ERRORS, ids=list(STREAM_ERRORS))
def test_stream_errors_reset_the_stream_with_the_rfc_code(raw: RawHttp2, case: str) -> None:
    send, code = STREAM_ERRORS[case]
    send(raw)
    assert raw.outcome(1) == ("reset", code)
    still_serves(raw, 3)


# Malformed requests (RFC 9113 8.1.1, 8.2, 8.3): the stream is reset with PROTOCOL_ERROR -------

BASE = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", SERVICE + "ServerLive"),
    (":authority", "t"),
    ("content-type", "application/grpc"),
]
MALFORMED: dict[str, list[tuple[str, str]]] = {
    "uppercase-name": [*BASE, ("X-Upper", "1")],
    "pseudo-header-after-a-field": [*BASE[:4], ("content-type", "application/grpc"), (":authority", "u")],
    "unknown-pseudo-header": [*BASE, (":status", "200")],
    "repeated-pseudo-header": [*BASE, (":path", "/x")],
    "no-path": [BASE[0], BASE[1], BASE[3], BASE[4]],
    "no-method": BASE[1:],
    "connection-header": [*BASE, ("connection", "keep-alive")],
    "te-not-trailers": [*BASE, ("te", "gzip")],
    "value-with-newline": [*BASE, ("x-a", "1\n2")],
    "name-with-colon": [*BASE, ("x:a", "1")],
}


@pytest.mark.parametrize("fields", MALFORMED.values(), ids=list(MALFORMED))
def test_malformed_requests_reset_their_stream(raw: RawHttp2, fields: list[tuple[str, str]]) -> None:
    raw.open()
    raw.send(frame(HEADERS, END_HEADERS | END_STREAM, 1, bytes(raw.encoder.encode(fields))))
    assert raw.outcome(1) == ("reset", PROTOCOL_ERROR)
    still_serves(raw, 3)


@pytest.mark.parametrize("value", [" 1", "1\t", " "])
def test_a_value_with_white_space_at_an_end_is_taken_as_grpc_takes_it(raw: RawHttp2, value: str) -> None:
    """RFC 9113 8.2.1 calls such a value malformed, but gRPC's own server (and so Triton) takes
    it: a drop-in answers the call."""
    raw.open(setting(INITIAL_WINDOW_SIZE, 65535))
    raw.send(
        frame(HEADERS, END_HEADERS, 1, request_headers(raw, "ServerLive", ("x-a", value)))
        + frame(DATA, END_STREAM, 1, message(b""))
    )
    kind, fields = raw.outcome(1)
    assert kind == "answer" and fields["grpc-status"] == "0", (kind, fields)  # type: ignore[index]
    still_serves(raw, 3)


# Frames that are ignored: the connection goes on -----------------------------------------------

IGNORED: dict[str, Case] = {
    "unknown-frame-type": _opened(frame(0xFA, 0xFF, 0, b"anything")),
    "unknown-flags-on-ping": _opened(frame(PING, 0xF6, 0, b"12345678")),
    "unknown-setting": _opened(frame(SETTINGS, 0, 0, setting(0xFF, 7))),
    "priority-on-an-idle-stream": _opened(frame(PRIORITY, 0, 9, b"\x00\x00\x00\x01\x10")),
    "a-ping-ack-from-the-client": _opened(frame(PING, ACK, 0, b"12345678")),
    "rst-after-the-answer": _after_call(lambda raw: frame(RST_STREAM, 0, 1, struct.pack(">I", 8))),
    "window-update-after-the-answer": _after_call(lambda raw: frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 9))),
    "data-after-a-reset": lambda raw: (raw.open(), raw.send(frame(HEADERS, END_HEADERS, 1, request_headers(raw)) + frame(RST_STREAM, 0, 1, struct.pack(">I", 8)) + frame(DATA, 0, 1, b"late"))),  # type: ignore[dict-item]
    "reserved-bit-of-the-stream-id": _opened(struct.pack(">HBBBI", 0, 8, PING, 0, 1 << 31) + b"12345678"),
}  # fmt: skip


@pytest.mark.parametrize("case", IGNORED.values(), ids=list(IGNORED))
def test_frames_a_server_ignores_leave_the_connection_serving(raw: RawHttp2, case: Case) -> None:
    case(raw)
    still_serves(raw, 11)


def test_pings_are_answered_with_their_payload(raw: RawHttp2) -> None:
    raw.open()
    raw.send(frame(PING, 0, 0, b"abcdefgh"))
    acks = [payload for kind, flags, _sid, payload in raw.frames(5) if kind == PING and flags & ACK]
    assert acks[:1] == [b"abcdefgh"]


def test_settings_are_acknowledged(raw: RawHttp2) -> None:
    raw.open(setting(INITIAL_WINDOW_SIZE, 1000))
    for kind, flags, _sid, _payload in raw.frames(5):
        if kind == SETTINGS and flags & ACK:
            return
    raise AssertionError("no SETTINGS ACK came")


def test_a_smaller_initial_window_holds_answers_back_until_it_grows(raw: RawHttp2) -> None:
    # 6.9.2: a window may go negative; the stream sends again once it is positive.
    raw.open(setting(INITIAL_WINDOW_SIZE, 0))
    raw.send(infer(raw, 1, 1000))
    assert raw.outcome(1, seconds=1.0)[0] == "open"  # its headers come, not its data
    raw.send(frame(SETTINGS, 0, 0, setting(INITIAL_WINDOW_SIZE, 65535)))
    kind, fields = raw.outcome(1)
    assert kind == "answer" and fields["grpc-status"] == "0", (kind, fields)  # type: ignore[index]
