"""Two gRPC servers that answer with canned bytes: the ceiling of each server design.

    python benchmarks/transports/grpc_canned_servers.py native|grpcio PORT CANNED.json

`grpcio`: grpc.aio with generic handlers that take and return bytes (no protobuf at all).
`native`: a prototype HTTP/2 server of our own on an asyncio Protocol under uvloop, written
for this measurement only: connection preface, SETTINGS/ACK, PING, WINDOW_UPDATE for what it
receives, HEADERS (+CONTINUATION) decoded with `hpack` behind a cache of repeated header
blocks, gRPC's 5-byte message framing, trailers. It honours no send window (its answers are
tiny; a long streaming trial can overrun the client's window and stall, so keep trials short)
and checks nothing a hostile client could abuse: a ceiling, not a server.

CANNED.json maps a method name (e.g. "ModelInfer") to the hex of its serialized response;
"ModelStreamInfer" answers each message of a stream with the ModelInfer answer and the request's
id (perf_analyzer matches stream answers by id). Unknown methods: UNIMPLEMENTED.
"""

from __future__ import annotations

import asyncio
import json
import struct
import sys
from collections.abc import AsyncIterator
from pathlib import Path

SERVICE = "inference.GRPCInferenceService"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
# Stream windows as large as the client lets us ask, so that unary calls need no update.
STREAM_WINDOW = 1 << 24
CONNECTION_WINDOW = 1 << 30
# ":status: 200" (static index 8) and "content-type: application/grpc" (static name 31,
# literal without indexing), encoded once: answers need no HPACK encoder state.
RESPONSE_HEADERS = b"\x88\x0f\x10\x10application/grpc"
OK_TRAILERS = b"\x00\x0bgrpc-status\x010"
UNIMPLEMENTED_TRAILERS = b"\x88\x0f\x10\x10application/grpc\x00\x0bgrpc-status\x0212"


def frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    """One HTTP/2 frame: 24-bit length, type, flags, stream id, payload."""
    length = len(payload)
    return struct.pack(">HBBBI", length >> 8, length & 0xFF, kind, flags, stream_id) + payload


def grpc_message(body: bytes) -> bytes:
    """gRPC's length-prefixed message: uncompressed flag, 32-bit length, bytes."""
    return struct.pack(">BI", 0, len(body)) + body


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_varint(data: bytes | bytearray, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, position


def request_id(request: bytes | bytearray) -> bytes:
    """The `id` (field 3) of a serialized ModelInferRequest; fields 1-3 come first in practice."""
    position = 0
    while position < len(request):
        key, position = _read_varint(request, position)
        if key & 7 != 2:  # the first fields are strings; anything else: no id up front
            return b""
        length, position = _read_varint(request, position)
        if key >> 3 == 3:
            return bytes(request[position : position + length])
        position += length
    return b""


def stream_answer(infer_answer: bytes, request: bytes | bytearray) -> bytes:
    """A ModelStreamInferResponse: the canned ModelInferResponse with the request's id appended."""
    identifier = request_id(request)
    inner = infer_answer + b"\x1a" + _varint(len(identifier)) + identifier
    return b"\x12" + _varint(len(inner)) + inner


class _Stream:
    """What the prototype keeps of an open stream: its method and unread message bytes."""

    __slots__ = ("answered_headers", "body", "method")

    def __init__(self, method: str) -> None:
        self.method = method
        self.body = bytearray()
        self.answered_headers = False


class NativeCannedProtocol(asyncio.Protocol):
    """One HTTP/2 connection answering gRPC calls from canned responses."""

    def __init__(self, canned: dict[str, bytes]) -> None:
        import hpack

        self.canned = {f"/{SERVICE}/{name}": grpc_message(body) for name, body in canned.items()}
        self.infer_answer = canned["ModelInfer"]
        self.decoder = hpack.Decoder()
        self.decoder.max_allowed_table_size = 4096
        self.blocks: dict[bytes, str] = {}  # header block -> :path, valid while the table is unchanged
        self.table_marker: tuple[int, object] = (0, None)
        self.buffer = bytearray()
        self.preface = False
        self.streams: dict[int, _Stream] = {}
        self.pending_block: tuple[int, int, bytearray] | None = None
        self.received = 0
        self.out: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport
        settings = struct.pack(">HIHI", 0x3, 1024, 0x4, STREAM_WINDOW)
        self.transport.write(
            frame(SETTINGS, 0, 0, settings)
            + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", CONNECTION_WINDOW - 65535))
        )

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        position = 0
        if not self.preface:
            if len(buffer) < 24:
                return
            if buffer[:24] != PREFACE:
                self.transport.close()
                return
            self.preface = True
            position = 24
        size = len(buffer)
        while size - position >= 9:
            length = (buffer[position] << 16) | (buffer[position + 1] << 8) | buffer[position + 2]
            if size - position - 9 < length:
                break
            kind = buffer[position + 3]
            flags = buffer[position + 4]
            stream_id = int.from_bytes(buffer[position + 5 : position + 9], "big") & 0x7FFFFFFF
            payload = bytes(buffer[position + 9 : position + 9 + length])
            position += 9 + length
            self._frame(kind, flags, stream_id, payload)
        del buffer[:position]
        if self.out:
            self.transport.write(b"".join(self.out))
            self.out.clear()

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if kind == DATA:
            self._data(flags, stream_id, payload)
        elif kind == HEADERS:
            if flags & PADDED:
                payload = payload[1 : len(payload) - payload[0]]
            if flags & PRIORITY:
                payload = payload[5:]
            if flags & END_HEADERS:
                self._headers(stream_id, flags, payload)
            else:
                self.pending_block = (stream_id, flags, bytearray(payload))
        elif kind == CONTINUATION and self.pending_block is not None:
            self.pending_block[2].extend(payload)
            if flags & END_HEADERS:
                opened, opening_flags, block = self.pending_block
                self.pending_block = None
                self._headers(opened, opening_flags, bytes(block))
        elif kind == SETTINGS and not flags & ACK:
            self.out.append(frame(SETTINGS, ACK, 0, b""))
        elif kind == PING and not flags & ACK:
            self.out.append(frame(PING, ACK, 0, payload))
        elif kind == RST_STREAM:
            self.streams.pop(stream_id, None)
        elif kind == GOAWAY:
            self.transport.close()

    def _path(self, block: bytes) -> str:
        path = self.blocks.get(block)
        if path is not None:
            return path
        headers = self.decoder.decode(block, raw=True)
        path = next((value.decode() for name, value in headers if name == b":path"), "")
        entries = self.decoder.header_table.dynamic_entries
        marker = (len(entries), entries[0] if entries else None)
        if marker != self.table_marker:
            # The block changed the dynamic table: cached blocks may now mean other headers.
            self.blocks.clear()
            self.table_marker = marker
        else:
            self.blocks[block] = path
        return path

    def _headers(self, stream_id: int, flags: int, block: bytes) -> None:
        stream = _Stream(self._path(block))
        self.streams[stream_id] = stream
        if flags & END_STREAM:
            self._finish(stream_id, stream)

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if flags & PADDED:
            payload = payload[1 : len(payload) - payload[0]]
        self.received += len(payload)
        if self.received > CONNECTION_WINDOW // 2:
            self.out.append(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self.received)))
            self.received = 0
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        stream.body += payload
        if stream.method.endswith("/ModelStreamInfer"):
            self._stream_messages(stream_id, stream, len(payload))
        if flags & END_STREAM:
            self._finish(stream_id, stream)

    def _stream_messages(self, stream_id: int, stream: _Stream, received: int) -> None:
        body = stream.body
        while len(body) >= 5:
            length = int.from_bytes(body[1:5], "big")
            if len(body) < 5 + length:
                break
            answer = grpc_message(stream_answer(self.infer_answer, body[5 : 5 + length]))
            del body[: 5 + length]
            if not stream.answered_headers:
                stream.answered_headers = True
                self.out.append(frame(HEADERS, END_HEADERS, stream_id, RESPONSE_HEADERS))
            self.out.append(frame(DATA, 0, stream_id, answer))
        if received:
            self.out.append(frame(WINDOW_UPDATE, 0, stream_id, struct.pack(">I", received)))

    def _finish(self, stream_id: int, stream: _Stream) -> None:
        del self.streams[stream_id]
        answer = self.canned.get(stream.method)
        if answer is None:
            self.out.append(frame(HEADERS, END_HEADERS | END_STREAM, stream_id, UNIMPLEMENTED_TRAILERS))
        elif stream.method.endswith("/ModelStreamInfer"):
            if not stream.answered_headers:
                self.out.append(frame(HEADERS, END_HEADERS, stream_id, RESPONSE_HEADERS))
            self.out.append(frame(HEADERS, END_HEADERS | END_STREAM, stream_id, OK_TRAILERS))
        else:
            self.out.append(
                frame(HEADERS, END_HEADERS, stream_id, RESPONSE_HEADERS)
                + frame(DATA, 0, stream_id, answer)
                + frame(HEADERS, END_HEADERS | END_STREAM, stream_id, OK_TRAILERS)
            )


async def serve_native(port: int, canned: dict[str, bytes]) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: NativeCannedProtocol(canned), "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


async def serve_grpcio(port: int, canned: dict[str, bytes]) -> None:
    import grpc

    def unary(answer: bytes):  # type: ignore[no-untyped-def]
        async def handle(request: bytes, context: object) -> bytes:
            return answer

        return grpc.unary_unary_rpc_method_handler(handle)

    infer_answer = canned["ModelInfer"]

    async def stream(requests: AsyncIterator[bytes], context: object) -> AsyncIterator[bytes]:
        async for request in requests:
            yield stream_answer(infer_answer, request)

    handlers = {name: unary(body) for name, body in canned.items() if name != "ModelStreamInfer"}
    handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(stream)
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def main() -> None:
    import uvloop

    kind, port, path = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    canned = {name: bytes.fromhex(value) for name, value in json.loads(path.read_text()).items()}
    # Both on uvloop, as coreserve runs its grpc.aio frontend.
    uvloop.run((serve_native if kind == "native" else serve_grpcio)(port, canned))


if __name__ == "__main__":
    main()
