"""A client that writes HTTP/2 frames by hand, for the tests of the native gRPC server.

grpc's clients never send what these tests send: bad prefaces, frames that break RFC 9113,
floods. Frames are built here byte by byte; header blocks with the `hpack` library.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import hpack
import numpy as np
import tritonclient.grpc as grpcclient

from coreserve.protos import grpc_service_pb2 as pb
from coreserve.testing import ServerProcess
from support.model_builders import identity_model, write_model

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    range(10)
)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
# Error codes (RFC 9113 7)
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, STREAM_CLOSED, FRAME_SIZE_ERROR = 0x0, 0x1, 0x3, 0x5, 0x6
REFUSED_STREAM, CANCEL, COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x7, 0x8, 0x9, 0xB
# Settings (RFC 9113 6.5.2)
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE = 1, 2, 3, 4, 5
SERVICE = "/inference.GRPCInferenceService/"
OPENING = PREFACE + struct.pack(">HBBBI", 0, 0, SETTINGS, 0, 0)  # the preface and an empty SETTINGS


# One instance: a stream's answers then come in request order (two, the onnxruntime default as
# on Triton, answer in the order the executions end).
IDENTITY = """
backend: "onnxruntime"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


def identity_server(repository: Path, *flags: str) -> ServerProcess:
    """A native gRPC server (no metrics port) over `repository`, with the `identity` model in it."""
    write_model(repository, "identity", identity_model("FP32", ["n"]), IDENTITY)
    return ServerProcess([repository], ["--grpc-server=native", "--allow-metrics=false", *flags]).start()


def assert_identity_answers(server: ServerProcess) -> None:
    """A real client's call to `identity` gets its input back."""
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        data = np.arange(8, dtype=np.float32)
        tensor = grpcclient.InferInput("INPUT0", [8], "FP32")
        tensor.set_data_from_numpy(data)
        np.testing.assert_array_equal(client.infer("identity", [tensor]).as_numpy("OUTPUT0"), data)


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    length = len(payload)
    return struct.pack(">HBBBI", length >> 8, length & 0xFF, kind, flags, stream_id) + payload


def setting(key: int, value: int) -> bytes:
    return struct.pack(">HI", key, value)


def message(body: bytes, compressed: bool = False) -> bytes:
    """One gRPC message: its compressed flag, its length and its bytes."""
    return struct.pack(">BI", int(compressed), len(body)) + body


def infer_request(values: int, model: str = "identity") -> bytes:
    """A ModelInferRequest of `values` FP32 numbers (0, 1, 2 ...) for INPUT0 of `model`."""
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[values])
    request.raw_input_contents.append(np.arange(values, dtype=np.float32).tobytes())
    return request.SerializeToString()


class RawHttp2:
    """A client connection that writes frames by hand and reads the server's frames back."""

    def __init__(self, server: ServerProcess) -> None:
        host, port = server.grpc_url.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.buffer = bytearray()
        self.closed = False  # by the server: `frames` saw its end of the connection

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def open(self, settings: bytes = b"") -> None:
        self.send(PREFACE + frame(SETTINGS, 0, 0, settings))

    def acknowledge_settings(self) -> None:
        """Reads until the server's SETTINGS and acknowledges them (a client that then only
        writes for a while must not have to answer anything meanwhile)."""
        for kind, flags, _sid, _payload in self.frames():
            if kind == SETTINGS and not flags & ACK:
                self.send(frame(SETTINGS, ACK, 0))
                return
        raise AssertionError("the server sent no SETTINGS")

    def headers_block(self, method: str, *extra: tuple[str, str]) -> bytes:
        fields = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", SERVICE + method),
            (":authority", "test"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            *extra,
        ]
        return bytes(self.encoder.encode(fields))

    def frames(self, seconds: float = 10.0) -> Iterator[tuple[int, int, int, bytes]]:
        """The server's frames as they come, until it closes or `seconds` pass."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            while len(self.buffer) >= 9:
                length = int.from_bytes(self.buffer[:3], "big")
                if len(self.buffer) < 9 + length:
                    break
                kind, flags = self.buffer[3], self.buffer[4]
                stream_id = int.from_bytes(self.buffer[5:9], "big") & 0x7FFFFFFF
                payload = bytes(self.buffer[9 : 9 + length])
                del self.buffer[: 9 + length]
                yield kind, flags, stream_id, payload
            try:
                chunk = self.sock.recv(1 << 20)
            except ConnectionResetError:
                self.closed = True
                return
            except TimeoutError:
                return
            if not chunk:
                self.closed = True
                return
            self.buffer += chunk

    def call(self, stream_id: int, seconds: float = 10.0) -> tuple[dict[str, str], bytes]:
        """Reads until `stream_id` ends: its headers and trailers merged, and its DATA bytes."""
        fields: dict[str, str] = {}
        body = bytearray()
        for kind, flags, sid, payload in self.frames(seconds):
            if kind == SETTINGS and not flags & 1:
                self.send(frame(SETTINGS, 1, 0))
            if sid != stream_id:
                continue
            if kind == HEADERS:
                fields.update(self.decoder.decode(payload))
            elif kind == DATA:
                body += payload
            if (flags & END_STREAM and kind in (HEADERS, DATA)) or kind == RST_STREAM:
                break
        return fields, bytes(body)

    def granted_call(self, stream_id: int, window: int) -> tuple[list[tuple[str, str]], bytes, int]:
        """Reads `stream_id`'s answer as a client whose windows are `window` bytes: each DATA
        frame (never larger) is granted back at once. Its trailers, DATA bytes and DATA frames."""
        body, pieces = b"", 0
        for kind, flags, sid, payload in self.frames():
            if kind == SETTINGS and not flags & 1:
                self.send(frame(SETTINGS, 1, 0))
            if sid != stream_id:
                continue
            if kind == DATA:
                assert len(payload) <= window
                body += payload
                pieces += 1
                grant = struct.pack(">I", len(payload))
                self.send(frame(WINDOW_UPDATE, 0, stream_id, grant) + frame(WINDOW_UPDATE, 0, 0, grant))
            if kind == HEADERS and flags & END_STREAM:
                return self.decoder.decode(payload), body, pieces
        raise AssertionError(f"stream {stream_id} did not end")

    def goaway_code(self, seconds: float = 10.0) -> int | None:
        """The error code of the server's GOAWAY, once it has closed the connection."""
        code = None
        for kind, _flags, _sid, payload in self.frames(seconds):
            if kind == GOAWAY:
                code = int.from_bytes(payload[4:8], "big")
        return code

    def outcome(self, stream_id: int, seconds: float = 10.0) -> tuple[str, object]:
        """How the server ends `stream_id`: ("reset", its RST_STREAM code), ("goaway", the
        GOAWAY code) or ("answer", its header fields, trailers merged); ("open", None) when
        nothing ends it within `seconds`."""
        fields: dict[str, str] = {}
        for kind, flags, sid, payload in self.frames(seconds):
            if kind == SETTINGS and not flags & ACK:
                self.send(frame(SETTINGS, ACK, 0))
            elif kind == GOAWAY:
                return "goaway", int.from_bytes(payload[4:8], "big")
            elif sid == stream_id and kind == RST_STREAM:
                return "reset", int.from_bytes(payload, "big")
            elif sid == stream_id and kind == HEADERS:
                fields.update(self.decoder.decode(payload))
                if flags & END_STREAM:
                    return "answer", fields
        return "open", None

    def close(self) -> None:
        self.sock.close()
