"""A client HTTP/2 connection that writes frames by hand and notes what the server sends back,
for http2_attacks.py: what grpc's clients never send (floods, bombs, resets), with every send
bounded by a deadline so that a server that stops reading cannot hold the caller.

A reader thread parses the server's frames: it acknowledges SETTINGS and PINGs as a client must
(while reading is not paused), follows the server's flow-control windows, and counts GOAWAYs,
RST_STREAMs and answers. Streams that the caller tracks keep their headers and status.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import grpc
import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    range(10)
)
FRAME_NAMES = ("DATA", "HEADERS", "PRIORITY", "RST_STREAM", "SETTINGS", "PUSH_PROMISE", "PING", "GOAWAY",
               "WINDOW_UPDATE", "CONTINUATION")  # fmt: skip
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
SETTINGS_HEADER_TABLE_SIZE, SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE = 0x1, 0x4, 0x5
ERROR_CODES = ("NO_ERROR", "PROTOCOL_ERROR", "INTERNAL_ERROR", "FLOW_CONTROL_ERROR", "SETTINGS_TIMEOUT",
               "STREAM_CLOSED", "FRAME_SIZE_ERROR", "REFUSED_STREAM", "CANCEL", "COMPRESSION_ERROR",
               "CONNECT_ERROR", "ENHANCE_YOUR_CALM", "INADEQUATE_SECURITY", "HTTP_1_1_REQUIRED")  # fmt: skip
CANCEL = 0x8
STATUS_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}
MAX_WINDOW = 2**31 - 1
SERVICE = "/inference.GRPCInferenceService/"


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", kind, flags, stream_id) + payload


def grpc_message(body: bytes, compressed: bool = False) -> bytes:
    """One length-prefixed gRPC message."""
    return struct.pack(">BI", int(compressed), len(body)) + body


def error_name(code: int) -> str:
    return ERROR_CODES[code] if code < len(ERROR_CODES) else f"0x{code:x}"


def request_fields(method: str, *extra: tuple[str, str]) -> list[tuple[str, str]]:
    """The header fields of a gRPC call to GRPCInferenceService's `method`."""
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", SERVICE + method),
        (":authority", "attacker"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        *extra,
    ]


@dataclass
class StreamAnswer:
    """What the server sent on one tracked stream."""

    fields: dict[str, str] = field(default_factory=dict)
    data_bytes: int = 0
    reset: str | None = None  # the RST_STREAM code's name
    ended: bool = False
    ended_at: float = 0.0

    @property
    def outcome(self) -> str:
        """Its gRPC status by name and message, or how it ended without one."""
        if "grpc-status" in self.fields:
            code = int(self.fields["grpc-status"])
            name = STATUS_NAMES.get(code, str(code))
            return f"{name} {self.fields.get('grpc-message', '')[:80]}".strip()
        if self.reset is not None:
            return f"RST_STREAM {self.reset}"
        return "ended without status" if self.ended else "no answer"


@dataclass
class ServerReplies:
    """What the server sent on one connection, counted."""

    frames: Counter[str] = field(default_factory=Counter)
    resets: Counter[str] = field(default_factory=Counter)
    goaways: list[tuple[str, str]] = field(default_factory=list)  # (code, debug data)
    closed_by_server: bool = False
    close_reason: str = ""


class Http2Connection:
    """One client connection to `address` ("host:port") with a reader thread."""

    def __init__(self, address: str, *, settings: bytes = b"", timeout: float = 5.0) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.decoder.max_allowed_table_size = 1 << 16
        self.decoder.max_header_list_size = 1 << 20
        self.replies = ServerReplies()
        self.sent_bytes = 0
        self.blocked_s = 0.0  # time a send waited for the server to read
        self.streams: dict[int, StreamAnswer] = {}  # the tracked ones
        self._send_lock = threading.Lock()
        self._windows = threading.Condition()
        self._connection_window = 65535
        self._initial_window = 65535
        self._stream_windows: dict[int, int] = {}
        self.server_settings: dict[int, int] = {}
        self._settings_acked = threading.Event()
        self._reading = threading.Event()
        self._reading.set()
        self._closed = threading.Event()
        # A header block being continued: its stream, its HEADERS frame's flags, the block so far.
        self._block: tuple[int, int, bytearray] | None = None
        self._control = bytearray()  # ACKs the reader could not write at once (see _reply)
        self._control_lock = threading.Lock()
        our_settings = struct.pack(">HI", SETTINGS_INITIAL_WINDOW_SIZE, MAX_WINDOW) + settings
        opening = PREFACE + frame(SETTINGS, 0, 0, our_settings)
        opening += frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", MAX_WINDOW - 65535))
        # Before the reader starts: its ACK of the server's SETTINGS must follow the preface.
        self.send(opening, time.monotonic() + timeout)
        self._reader = threading.Thread(target=self._read, daemon=True, name="http2-reader")
        self._reader.start()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def wait_for_settings_ack(self, seconds: float = 5.0) -> bool:
        return self._settings_acked.wait(seconds)

    def pause_reading(self) -> None:
        """Stops reading the server's frames (what the server writes piles up on its side)."""
        self._reading.clear()

    def resume_reading(self) -> None:
        self._reading.set()

    def send(self, data: bytes, deadline: float) -> bool:
        """Writes `data` unless the deadline passes first; False if not all of it went (the
        connection is then mid-frame: close it), or the connection is closed."""
        with self._send_lock:
            if self._control:  # at a frame boundary here: the reader's ACKs go first
                with self._control_lock:
                    data, self._control = bytes(self._control) + data, bytearray()
            view = memoryview(data)
            while view:
                if self._closed.is_set():
                    return False
                try:
                    sent = self.sock.send(view)
                except BlockingIOError:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    waited = time.monotonic()
                    select.select([], [self.sock], [], min(remaining, 0.2))
                    self.blocked_s += time.monotonic() - waited
                    continue
                except OSError as exc:
                    self.replies.close_reason = self.replies.close_reason or f"on send: {type(exc).__name__}"
                    self.replies.closed_by_server = not self._closed.is_set()
                    self._closed.set()
                    return False
                self.sent_bytes += sent
                view = view[sent:]
        return True

    def headers(self, stream_id: int, fields: list[tuple[str, str]], *, end_stream: bool = False) -> bytes:
        """A HEADERS frame (one frame: blocks stay under the default 16 KiB frame size)."""
        block = bytes(self.encoder.encode(fields))
        return frame(HEADERS, END_HEADERS | (END_STREAM if end_stream else 0), stream_id, block)

    def track(self, stream_id: int) -> StreamAnswer:
        answer = self.streams[stream_id] = StreamAnswer()
        return answer

    def send_data(self, stream_id: int, payload: bytes, deadline: float) -> bool:
        """DATA frames carrying `payload` and ending the stream, within the server's flow-control
        windows (waits for its WINDOW_UPDATEs until the deadline)."""
        frame_size = self.server_settings.get(SETTINGS_MAX_FRAME_SIZE, 16384)
        offset = 0
        while True:
            with self._windows:
                while True:
                    window = min(
                        self._connection_window, self._stream_windows.get(stream_id, self._initial_window)
                    )
                    if window > 0 or offset == len(payload) or self._closed.is_set():
                        break
                    waited = self._windows.wait(min(0.2, max(0.0, deadline - time.monotonic())))
                    if not waited and time.monotonic() >= deadline:
                        return False
                if self._closed.is_set():
                    return False
                size = min(window, frame_size, len(payload) - offset)
                self._connection_window -= size
                self._stream_windows[stream_id] = (
                    self._stream_windows.get(stream_id, self._initial_window) - size
                )
            last = offset + size == len(payload)
            chunk = frame(DATA, END_STREAM if last else 0, stream_id, payload[offset : offset + size])
            if not self.send(chunk, deadline):
                return False
            offset += size
            if last:
                return True

    def wait_for(self, stream_id: int, deadline: float) -> StreamAnswer:
        """The tracked stream's answer once it ends, or when the deadline or the connection's
        end comes first."""
        answer = self.streams[stream_id]
        while not answer.ended and not self._closed.is_set() and time.monotonic() < deadline:
            time.sleep(0.002)
        return answer

    def linger(self, seconds: float) -> None:
        """Reads what the server still sends, for up to `seconds` or until it closes."""
        self.resume_reading()
        self._closed.wait(seconds)

    def close(self) -> None:
        """Ends the connection; the reader thread closes the socket as it leaves."""
        self._closed.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def _read(self) -> None:
        try:
            self._read_frames()
        finally:
            self._closed.set()
            with self._windows:
                self._windows.notify_all()
            with self._send_lock:  # a send in progress sees `closed` within 0.2 s and leaves
                self.sock.close()

    def _read_frames(self) -> None:
        buffer = bytearray()
        while not self._closed.is_set():
            if not self._reading.wait(0.1):
                continue
            try:
                readable, _, _ = select.select([self.sock], [], [], 0.1)
                if not readable:
                    continue
                chunk = self.sock.recv(1 << 20)
            except BlockingIOError:
                continue
            except OSError as exc:
                self.replies.close_reason = type(exc).__name__
                chunk = b""
            if not chunk:
                self.replies.close_reason = self.replies.close_reason or "EOF"
                self.replies.closed_by_server = not self._closed.is_set()
                return
            buffer += chunk
            offset = 0
            while len(buffer) - offset >= 9:
                length = int.from_bytes(buffer[offset : offset + 3], "big")
                if len(buffer) - offset < 9 + length:
                    break
                kind, flags = buffer[offset + 3], buffer[offset + 4]
                stream_id = int.from_bytes(buffer[offset + 5 : offset + 9], "big") & 0x7FFFFFFF
                self._on_frame(kind, flags, stream_id, bytes(buffer[offset + 9 : offset + 9 + length]))
                offset += 9 + length
            del buffer[:offset]

    def _on_frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        replies = self.replies
        replies.frames[FRAME_NAMES[kind] if kind < len(FRAME_NAMES) else f"0x{kind:x}"] += 1
        if kind == SETTINGS:
            if flags & ACK:
                self._settings_acked.set()
                return
            with self._windows:
                for index in range(0, len(payload) - 5, 6):
                    key, value = struct.unpack(">HI", payload[index : index + 6])
                    if key == SETTINGS_INITIAL_WINDOW_SIZE:
                        delta = value - self._initial_window
                        self._initial_window = value
                        for stream in self._stream_windows:
                            self._stream_windows[stream] += delta
                    self.server_settings[key] = value
                self._windows.notify_all()
            self._reply(frame(SETTINGS, ACK, 0))
        elif kind == PING and not flags & ACK:
            self._reply(frame(PING, ACK, 0, payload))
        elif kind == WINDOW_UPDATE and len(payload) == 4:
            increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
            with self._windows:
                if stream_id == 0:
                    self._connection_window += increment
                else:
                    self._stream_windows[stream_id] = (
                        self._stream_windows.get(stream_id, self._initial_window) + increment
                    )
                self._windows.notify_all()
        elif kind == GOAWAY and len(payload) >= 8:
            code = int.from_bytes(payload[4:8], "big")
            replies.goaways.append((error_name(code), payload[8:200].decode("utf-8", "replace")))
        elif kind == RST_STREAM and len(payload) == 4:
            reason = error_name(int.from_bytes(payload, "big"))
            replies.resets[reason] += 1
            answer = self.streams.get(stream_id)
            if answer is not None:
                answer.reset, answer.ended, answer.ended_at = reason, True, time.monotonic()
        elif kind in (HEADERS, CONTINUATION):
            self._on_header_block(kind, flags, stream_id, payload)
        elif kind == DATA:
            answer = self.streams.get(stream_id)
            if answer is not None:
                answer.data_bytes += len(payload)
                if flags & END_STREAM:
                    answer.ended, answer.ended_at = True, time.monotonic()

    def _reply(self, control: bytes) -> None:
        """Writes an ACK now, or, while a send holds the socket (a server that reads slowly),
        leaves it for that send to write first: the reader must not wait for the writer."""
        if self._send_lock.acquire(timeout=0.05):
            self._send_lock.release()
            self.send(control, time.monotonic() + 1)
        else:
            with self._control_lock:
                self._control += control

    def _on_header_block(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if kind == HEADERS:
            if flags & PADDED:
                payload = payload[1 : len(payload) - payload[0]]
            if flags & PRIORITY_FLAG:
                payload = payload[5:]
            self._block = (stream_id, flags, bytearray(payload))
        elif self._block is not None:
            self._block[2].extend(payload)
        if not flags & END_HEADERS or self._block is None:
            return
        block_stream, headers_flags, block = self._block
        self._block = None
        try:  # decoded on every stream: the decoder's table must follow the server's encoder
            fields = self.decoder.decode(bytes(block))
        except hpack.HPACKError as exc:
            self.replies.goaways.append(("(client) HPACK error", str(exc)))
            return
        answer = self.streams.get(block_stream)
        if answer is not None:
            answer.fields.update({str(name): str(value) for name, value in fields})
            if headers_flags & END_STREAM:
                answer.ended, answer.ended_at = True, time.monotonic()
        if headers_flags & END_STREAM and answer is None:
            self.replies.frames["trailers"] += 1
