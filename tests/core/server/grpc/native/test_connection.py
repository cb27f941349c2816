"""The native server's HTTP/2 connection, frames in and frames out, over an in-memory transport.

No sockets: `MemoryTransport` records what the connection writes and the test feeds the
client's bytes with `data_received`, as asyncio's own transport would. The connection serves
the real servicers (registered as grpc/native/_frontend.py registers them) over a real data
plane (coreserve.testing's in-process server with an ONNX identity model), so a call goes
through the data plane to onnxruntime and back. Frames are built with tests/support/wire/http2_raw.py's
encoders; every assertion is on the frames that came out, their order and their codes.
"""

from __future__ import annotations

import asyncio
import struct
import zlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, NamedTuple, TypeVar

import grpc
import hpack
import numpy as np
import pytest

from coreserve.protos import grpc_service_pb2 as pb
from coreserve.server.dataplane import DataPlane
from coreserve.server.grpc._server import add_services
from coreserve.server.grpc._transport import GrpcTransport
from coreserve.server.grpc.native import _limits as limits
from coreserve.server.grpc.native._connection import Http2Connection
from coreserve.testing import InProcessServer
from support.model_builders import identity_model, write_model
from support.wire.http2_raw import (
    ACK,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADER_TABLE_SIZE,
    HEADERS,
    IDENTITY,
    INITIAL_WINDOW_SIZE,
    NO_ERROR,
    OPENING,
    PING,
    PREFACE,
    PRIORITY,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    REFUSED_STREAM,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    RawHttp2,
    frame,
    infer_request,
    message,
    setting,
)

T = TypeVar("T")
MAX_MESSAGE = 64 * 1024 * 1024
NAMES = {
    DATA: "DATA",
    HEADERS: "HEADERS",
    RST_STREAM: "RST_STREAM",
    SETTINGS: "SETTINGS",
    PING: "PING",
    GOAWAY: "GOAWAY",
    WINDOW_UPDATE: "WINDOW_UPDATE",
}
OK_TRAILERS = [("grpc-status", "0")]
RESPONSE_HEADERS = [
    (":status", "200"),
    ("content-type", "application/grpc"),
    ("grpc-accept-encoding", "identity, deflate, gzip"),
]


class MemoryTransport(asyncio.Transport):
    """What the connection writes, kept; reading paused or not, closing, as a socket's transport."""

    def __init__(self) -> None:
        super().__init__()
        self.protocol: Http2Connection | None = None
        self.written = bytearray()
        self.wrote = asyncio.Event()
        self.reading = True
        self.closing = False
        self.aborted = False
        self.lost = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 50123) if name == "peername" else default

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert not self.closing, "written after close"
        self.written += data
        self.wrote.set()

    def writelines(self, parts: Any) -> None:
        for part in parts:
            self.write(part)

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return 0  # its client takes whatever is written

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def close(self) -> None:
        if not self.closing:  # as asyncio's: the protocol hears of it on the loop's next turn
            self.closing = True
            asyncio.get_running_loop().call_soon(self._lose)

    def abort(self) -> None:
        self.aborted = True
        self.close()

    def _lose(self) -> None:
        if not self.lost:
            self.lost = True
            assert self.protocol is not None
            self.protocol.connection_lost(None)


class Frame(NamedTuple):
    kind: str
    flags: int
    stream: int
    detail: Any  # decoded: header fields, DATA bytes, an error code, settings, ...
    raw: bytes = b""  # a HEADERS frame's header block as written (out of equality: see __eq__)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Frame) and self[:4] == other[:4]

    def __hash__(self) -> int:
        return hash(self[:4])


class MemoryClient(RawHttp2):
    """http2_raw's client over a MemoryTransport: `send` feeds the connection, `read` decodes
    what it wrote since the last read (header blocks in order, through one HPACK decoder)."""

    def __init__(self, connection: Http2Connection, transport: MemoryTransport) -> None:
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.buffer = bytearray()
        self.connection = connection
        self.transport = transport

    def send(self, data: bytes) -> None:
        self.connection.data_received(data)

    def frames(self, seconds: float = 0.0) -> Iterator[tuple[int, int, int, bytes]]:
        """The whole frames written so far (nothing waits: the transport holds all there is)."""
        self.buffer += self.transport.written
        self.transport.written.clear()
        while len(self.buffer) >= 9:
            length = int.from_bytes(self.buffer[:3], "big")
            assert len(self.buffer) >= 9 + length, "the connection wrote part of a frame"
            kind, flags = self.buffer[3], self.buffer[4]
            stream_id = int.from_bytes(self.buffer[5:9], "big") & 0x7FFFFFFF
            payload = bytes(self.buffer[9 : 9 + length])
            del self.buffer[: 9 + length]
            yield kind, flags, stream_id, payload

    def read(self) -> list[Frame]:
        return [self._decoded(*parts) for parts in self.frames()]

    def _decoded(self, kind: int, flags: int, stream_id: int, payload: bytes) -> Frame:
        detail: Any = payload
        if kind == HEADERS:
            detail = [(str(name), str(value)) for name, value in self.decoder.decode(payload)]
        elif kind in (RST_STREAM, WINDOW_UPDATE):
            detail = int.from_bytes(payload, "big")
        elif kind == SETTINGS:
            detail = dict(struct.iter_unpack(">HI", payload))
        elif kind == GOAWAY:
            last, code = struct.unpack(">II", payload[:8])
            detail = (last, code, payload[8:].decode())
        return Frame(
            NAMES.get(kind, str(kind)), flags, stream_id, detail, payload if kind == HEADERS else b""
        )

    async def until_ends(self, stream_id: int) -> list[Frame]:
        """The frames written until `stream_id` ends (END_STREAM or RST_STREAM) or GOAWAY comes."""
        seen: list[Frame] = []
        while True:
            self.transport.wrote.clear()
            seen += self.read()
            for item in seen:
                if item.kind == "GOAWAY" or (
                    item.stream == stream_id
                    and (
                        item.kind == "RST_STREAM"
                        or (item.kind in ("HEADERS", "DATA") and item.flags & END_STREAM)
                    )
                ):
                    return seen
            await asyncio.wait_for(self.transport.wrote.wait(), 60)

    def unary(self, stream_id: int, method: str, body: bytes, *extra: tuple[str, str]) -> None:
        """A whole unary call: its HEADERS, then its one message with END_STREAM."""
        self.send(
            frame(HEADERS, END_HEADERS, stream_id, self.headers_block(method, *extra))
            + frame(DATA, END_STREAM, stream_id, message(body))
        )


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    """A real data plane with http2_raw's `identity` model (FP32 in, the same out)."""
    root = tmp_path_factory.mktemp("native-connection-models")
    write_model(root, "identity", identity_model("FP32", ["n"]), IDENTITY)
    server = InProcessServer(root).start()
    try:
        server.load("identity")
        yield server
    finally:
        server.stop()


class Handlers(dict[str, grpc.RpcMethodHandler]):
    """The method table, registered as NativeGrpcFrontend registers it (grpc.aio's interface)."""

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        """Ignored, as the frontend ignores it: the same handlers come registered by method."""

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        for name, handler in handlers.items():
            self[f"/{service}/{name}"] = handler


class Session(NamedTuple):
    connection: Http2Connection
    transport: MemoryTransport
    client: MemoryClient
    closed: list[Http2Connection]


def _session(
    dataplane: DataPlane,
    settings: GrpcTransport,
    max_message: int = MAX_MESSAGE,
    extra: dict[str, grpc.RpcMethodHandler] | None = None,
) -> Session:
    """A new connection on the running loop, made as NativeGrpcFrontend makes one (with the
    `extra` methods of a test's own beside the services')."""
    handlers = Handlers()
    add_services(handlers, dataplane, None, takes_pieces=True)
    handlers.update(extra or {})
    closed: list[Http2Connection] = []
    connection = Http2Connection(handlers, max_message, settings, closed.append)
    transport = MemoryTransport()
    transport.protocol = connection
    connection.connection_made(transport)
    return Session(connection, transport, MemoryClient(connection, transport), closed)


async def _run(
    dataplane: DataPlane,
    scenario: Callable[[Session], Awaitable[T]],
    settings: GrpcTransport | None = None,
    max_message: int = MAX_MESSAGE,
    extra: dict[str, grpc.RpcMethodHandler] | None = None,
) -> T:
    session = _session(dataplane, settings or GrpcTransport(), max_message, extra)
    try:
        return await scenario(session)
    finally:
        if not session.transport.closing:
            session.transport.close()
        await asyncio.sleep(0)  # connection_lost: the calls left are cancelled


@pytest.fixture
def run(kit: InProcessServer) -> Callable[..., Any]:
    """Runs a scenario with a new connection on the server's loop (`settings`: its transport's;
    `extra`: methods of the test's own, by path)."""
    assert kit.dataplane is not None
    dataplane = kit.dataplane

    def run(
        scenario: Callable[[Session], Awaitable[T]],
        settings: GrpcTransport | None = None,
        max_message: int = MAX_MESSAGE,
        extra: dict[str, grpc.RpcMethodHandler] | None = None,
    ) -> T:
        return kit.run(_run(dataplane, scenario, settings, max_message, extra))

    return run


class StillClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock stands still, so that no token bucket refills meanwhile."""

    def time(self) -> float:
        return 0.0


@pytest.fixture
def run_still(kit: InProcessServer) -> Iterator[Callable[[Callable[[Session], Awaitable[T]]], T]]:
    """Runs a scenario with a new connection on a loop of its own whose clock stands still: the
    abuse budgets (limits.RateBudget) then count exactly. Its calls never reach the data plane."""
    assert kit.dataplane is not None
    dataplane = kit.dataplane
    loop = StillClockLoop()
    yield lambda scenario: loop.run_until_complete(_run(dataplane, scenario))
    loop.close()


async def opened(session: Session) -> MemoryClient:
    """The client's preface and SETTINGS sent, the server's SETTINGS, WINDOW_UPDATE and ACK read."""
    client = session.client
    client.send(OPENING)
    client.send(frame(SETTINGS, ACK, 0))
    client.read()
    return client


def goaway(code: int, reason: str, last: int = 0) -> Frame:
    return Frame("GOAWAY", 0, 0, (last, code, reason))


# The preface and SETTINGS ------------------------------------------------------------------


def test_the_server_speaks_first_then_acknowledges_the_clients_settings(run: Callable[..., Any]) -> None:
    async def scenario(session: Session) -> list[list[Frame]]:
        client = session.client
        seen = [client.read()]  # on connection_made, before the client says anything
        client.send(PREFACE[:10])
        seen.append(client.read())  # part of a preface: nothing yet
        client.send(PREFACE[10:] + frame(SETTINGS, 0, 0, setting(INITIAL_WINDOW_SIZE, 1 << 20)))
        seen.append(client.read())
        client.send(frame(SETTINGS, ACK, 0))  # the client acknowledges ours: nothing to answer
        seen.append(client.read())
        return seen

    announced, partial, acknowledged, quiet = run(scenario)
    assert announced == [
        Frame(
            "SETTINGS",
            0,
            0,
            {
                3: limits.MAX_CONCURRENT,  # MAX_CONCURRENT_STREAMS
                4: limits.STREAM_WINDOW,  # INITIAL_WINDOW_SIZE
                5: limits.MAX_FRAME_SIZE,
                6: limits.MAX_HEADER_LIST,  # MAX_HEADER_LIST_SIZE
            },
        ),
        Frame("WINDOW_UPDATE", 0, 0, limits.CONNECTION_WINDOW - 65535),  # from RFC 9113's initial 65,535
    ]
    assert (partial, acknowledged, quiet) == ([], [Frame("SETTINGS", ACK, 0, {})], [])


@pytest.mark.parametrize(
    ("opening", "reason"),
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "not an HTTP/2 connection preface"),
        (PREFACE + frame(PING, 0, 0, bytes(8)), "the connection preface ends without SETTINGS"),
        (PREFACE + frame(SETTINGS, ACK, 0), "the connection preface ends without SETTINGS"),
    ],
)
def test_a_bad_preface_ends_the_connection_with_protocol_error(
    run: Callable[..., Any], opening: bytes, reason: str
) -> None:
    async def scenario(session: Session) -> tuple[list[Frame], bool, bool]:
        session.client.read()
        session.client.send(opening)
        frames = session.client.read()
        await asyncio.sleep(0)  # the transport reports the close on the loop's next turn
        return frames, session.transport.closing, session.closed == [session.connection]

    assert run(scenario) == ([goaway(PROTOCOL_ERROR, reason)], True, True)


# Calls -------------------------------------------------------------------------------------


def test_a_unary_call_answers_headers_one_message_and_trailers(run: Callable[..., Any]) -> None:
    async def scenario(session: Session) -> tuple[list[Frame], list[Frame], int]:
        client = await opened(session)
        client.unary(1, "ServerLive", pb.ServerLiveRequest().SerializeToString())
        first = await client.until_ends(1)
        # The second call names the fields the first added to the HPACK table by their index.
        client.unary(3, "ServerLive", b"")
        second = await client.until_ends(3)
        return first, second, len(session.connection.calls)

    first, second, open_calls = run(scenario)
    live = message(pb.ServerLiveResponse(live=True).SerializeToString())
    assert first == [
        Frame("HEADERS", END_HEADERS, 1, RESPONSE_HEADERS),
        Frame("DATA", 0, 1, live),
        Frame("HEADERS", END_HEADERS | END_STREAM, 1, OK_TRAILERS),
    ]
    assert second == [
        Frame("HEADERS", END_HEADERS, 3, RESPONSE_HEADERS),
        Frame("DATA", 0, 3, live),
        Frame("HEADERS", END_HEADERS | END_STREAM, 3, OK_TRAILERS),
    ]
    assert open_calls == 0


def test_model_infer_runs_the_model_through_the_data_plane(
    kit: InProcessServer, run: Callable[..., Any]
) -> None:
    assert kit.dataplane is not None
    version = kit.dataplane.model_version("identity")
    before = version.statistics.success.count

    async def scenario(session: Session) -> list[Frame]:
        client = await opened(session)
        client.unary(1, "ModelInfer", infer_request(8))
        return await client.until_ends(1)

    headers, data, trailers = run(scenario)
    assert (headers, trailers) == (
        Frame("HEADERS", END_HEADERS, 1, RESPONSE_HEADERS),
        Frame("HEADERS", END_HEADERS | END_STREAM, 1, OK_TRAILERS),
    )
    assert (data.kind, data.flags, data.stream) == ("DATA", 0, 1)
    compressed, length = struct.unpack(">BI", data.detail[:5])
    assert (compressed, length) == (0, len(data.detail) - 5)
    response = pb.ModelInferResponse.FromString(data.detail[5:])
    assert (response.model_name, response.model_version) == ("identity", "1")
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [("OUTPUT0", "FP32", [8])]
    np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[0], np.float32), np.arange(8))
    assert version.statistics.success.count - before == 1


def test_failed_calls_answer_trailers_only_with_the_grpc_status(run: Callable[..., Any]) -> None:
    async def scenario(session: Session) -> list[list[Frame]]:
        client = await opened(session)
        client.unary(1, "ModelInfer", infer_request(2, model="nope"))
        unknown_model = await client.until_ends(1)
        # A method refused at its HEADERS: one that ends the client's side gets the answer alone;
        # one whose client would still send has its stream reset (NO_ERROR) after the answer,
        # and its DATA is dropped.
        client.send(frame(HEADERS, END_HEADERS | END_STREAM, 3, client.headers_block("NoSuchMethod")))
        ended = client.read()
        client.unary(5, "NoSuchMethod", b"")
        still_sending = client.read()
        return [unknown_model, ended, still_sending]

    unknown_model, ended, still_sending = run(scenario)
    trailers_only = [(":status", "200"), ("content-type", "application/grpc")]
    assert unknown_model == [
        Frame(
            "HEADERS",
            END_HEADERS | END_STREAM,
            1,
            [
                *trailers_only,
                ("grpc-status", "5"),
                ("grpc-message", "Request for unknown model: 'nope' is not found"),
            ],
        )
    ]
    not_found = [*trailers_only, ("grpc-status", "12"), ("grpc-message", "Method not found!")]
    assert ended == [Frame("HEADERS", END_HEADERS | END_STREAM, 3, not_found)]
    assert still_sending == [
        Frame("HEADERS", END_HEADERS | END_STREAM, 5, not_found),
        Frame("RST_STREAM", 0, 5, NO_ERROR),
    ]


def test_a_header_list_over_the_limit_is_refused_with_resource_exhausted(run: Callable[..., Any]) -> None:
    async def scenario(session: Session) -> tuple[int, list[Frame]]:
        client = await opened(session)
        # Huffman-coded, the block stays under MAX_HEADER_BLOCK: the list alone is too large.
        block = client.headers_block("ServerLive", ("x-big", "a" * limits.MAX_HEADER_LIST))
        size = sum(len(name) + len(value) + 32 for name, value in hpack.Decoder().decode(block, raw=True))
        client.send(frame(HEADERS, END_HEADERS | END_STREAM, 1, block))
        return size, client.read()

    size, frames = run(scenario)
    assert size > limits.MAX_HEADER_LIST
    assert frames == [
        Frame(
            "HEADERS",
            END_HEADERS | END_STREAM,
            1,
            [
                (":status", "200"),
                ("content-type", "application/grpc"),
                ("grpc-status", "8"),  # RESOURCE_EXHAUSTED
                ("grpc-message", f"header list of {size} bytes (at most {limits.MAX_HEADER_LIST})"),
            ],
        )
    ]


def test_a_message_over_the_size_limit_is_refused_and_its_stream_reset(run: Callable[..., Any]) -> None:
    limit = 64

    async def scenario(session: Session) -> tuple[list[Frame], list[Frame], int]:
        client = await opened(session)
        request = infer_request(32)  # 128 bytes of FP32 alone
        client.send(frame(HEADERS, END_HEADERS, 1, client.headers_block("ModelInfer")))
        client.send(frame(DATA, 0, 1, message(request)[:20]))  # the prefix says how large it is
        refused = client.read()
        client.send(frame(DATA, END_STREAM, 1, message(request)[20:]))  # dropped: the call has ended
        return refused, client.read(), len(session.connection.calls)

    refused, after, open_calls = run(scenario, max_message=limit)
    size = len(infer_request(32))
    assert refused == [
        Frame(
            "HEADERS",
            END_HEADERS | END_STREAM,
            1,
            [
                (":status", "200"),
                ("content-type", "application/grpc"),
                ("grpc-status", "8"),  # RESOURCE_EXHAUSTED, in grpc's words
                ("grpc-message", f"Received message larger than max ({size} vs. {limit})"),
            ],
        ),
        Frame("RST_STREAM", 0, 1, NO_ERROR),  # the client was still sending: it need not
    ]
    assert (after, open_calls) == ([], 0)


def test_client_trailers_end_its_side_and_malformed_ones_reset_the_stream(run: Callable[..., Any]) -> None:
    async def scenario(session: Session) -> tuple[list[Frame], list[Frame]]:
        client = await opened(session)
        # The message, then trailers (HEADERS with END_STREAM and no pseudo-header) end the input.
        client.send(
            frame(HEADERS, END_HEADERS, 1, client.headers_block("ServerLive"))
            + frame(DATA, 0, 1, message(b""))
            + frame(HEADERS, END_HEADERS | END_STREAM, 1, bytes(client.encoder.encode([("x-done", "1")])))
        )
        answered = await client.until_ends(1)
        # RFC 9113 8.1: trailers may carry no pseudo-header.
        client.send(
            frame(HEADERS, END_HEADERS, 3, client.headers_block("ServerLive"))
            + frame(HEADERS, END_HEADERS | END_STREAM, 3, bytes(client.encoder.encode([(":path", "/x")])))
        )
        return answered, client.read()

    answered, malformed = run(scenario)
    assert [(item.kind, item.flags) for item in answered] == [
        ("HEADERS", END_HEADERS),
        ("DATA", 0),
        ("HEADERS", END_HEADERS | END_STREAM),
    ]
    assert answered[-1].detail == OK_TRAILERS
    assert malformed == [Frame("RST_STREAM", 0, 3, PROTOCOL_ERROR)]


def test_inference_answers_are_gzipped_for_clients_that_take_it(run: Callable[..., Any]) -> None:
    async def scenario(session: Session) -> tuple[list[Frame], list[Frame]]:
        client = await opened(session)
        client.unary(1, "ModelInfer", infer_request(4), ("grpc-accept-encoding", "identity, gzip"))
        gzipped = await client.until_ends(1)
        client.unary(3, "ModelInfer", infer_request(4))  # a client that does not say it takes gzip
        return gzipped, await client.until_ends(3)

    (headers, data, trailers), (_, plain, _) = run(scenario, GrpcTransport(compression_level="high"))
    assert headers.detail == [*RESPONSE_HEADERS, ("grpc-encoding", "gzip")]
    assert trailers.detail == OK_TRAILERS
    flag, length = struct.unpack(">BI", data.detail[:5])
    assert (flag, length) == (1, len(data.detail) - 5)
    assert zlib.decompress(data.detail[5:], wbits=31) == plain.detail[5:]
    assert plain.detail[0] == 0  # not compressed


def test_a_smaller_header_table_is_announced_before_the_next_block(run: Callable[..., Any]) -> None:
    async def scenario(session: Session) -> list[list[Frame]]:
        client = session.client
        client.decoder.max_allowed_table_size = 0  # what the client's SETTINGS says
        client.send(PREFACE + frame(SETTINGS, 0, 0, setting(HEADER_TABLE_SIZE, 0)))
        client.read()
        return [await _answer(client, stream) for stream in (1, 3)]

    first, second = run(scenario)
    for stream, answer in ((1, first), (3, second)):
        assert [(item.kind, item.stream) for item in answer] == [
            ("HEADERS", stream),
            ("DATA", stream),
            ("HEADERS", stream),
        ]
        assert (answer[0].detail, answer[2].detail) == (RESPONSE_HEADERS, OK_TRAILERS)
    # RFC 7541 4.2: a dynamic table size update (to 0) opens the first block after the change,
    # and no later block has one; with no room for them, no field is indexed.
    blocks = [item.raw for item in first + second if item.kind == "HEADERS"]
    assert [block[:1] == b"\x20" for block in blocks] == [True, False, False, False]


async def _answer(client: MemoryClient, stream: int) -> list[Frame]:
    client.unary(stream, "ServerLive", b"")
    return await client.until_ends(stream)


# Flow control ------------------------------------------------------------------------------


def test_received_bytes_are_granted_back_per_stream_and_per_connection(run: Callable[..., Any]) -> None:
    frame_size = limits.MAX_FRAME_SIZE  # a quarter of the stream window: each frame is granted back
    frames = limits.CONNECTION_WINDOW // 4 // frame_size  # a quarter of the connection window

    async def scenario(session: Session) -> tuple[list[Frame], list[Frame], int]:
        client = await opened(session)
        # One message larger than all the frames sent: the call waits for the rest.
        header = struct.pack(">BI", 0, frames * frame_size + 100)
        client.send(frame(HEADERS, END_HEADERS, 1, client.headers_block("ModelInfer")))
        client.send(frame(DATA, 0, 1, header + bytes(frame_size - 5)))
        for _ in range(frames - 1):
            client.send(frame(DATA, 0, 1, bytes(frame_size)))
        granted = client.read()
        client.send(frame(RST_STREAM, 0, 1, struct.pack(">I", 8)))  # CANCEL
        return granted, client.read(), len(session.connection.calls)

    granted, after_reset, open_calls = run(scenario)
    stream_grants = [Frame("WINDOW_UPDATE", 0, 1, frame_size)] * frames
    # The last frame brings the connection's count to a quarter of its window: both are granted.
    assert granted == [
        *stream_grants[:-1],
        Frame("WINDOW_UPDATE", 0, 0, frames * frame_size),
        stream_grants[-1],
    ]
    assert (after_reset, open_calls) == ([], 0)


def test_answers_wait_for_the_clients_windows(run: Callable[..., Any]) -> None:
    window = 16

    async def scenario(session: Session) -> tuple[list[Frame], list[list[Frame]], list[Frame]]:
        client = session.client
        client.send(PREFACE + frame(SETTINGS, 0, 0, setting(INITIAL_WINDOW_SIZE, window)))
        client.read()
        client.unary(1, "ModelInfer", infer_request(8))
        first: list[Frame] = []
        while sum(len(item.detail) for item in first if item.kind == "DATA") < window:
            client.transport.wrote.clear()
            first += client.read()
            if not first:
                await asyncio.wait_for(client.transport.wrote.wait(), 60)
        (length,) = struct.unpack(">I", first[1].detail[1:5])
        granted = []
        for _ in range((5 + length - window + window - 1) // window):
            # A grant goes out while the client's frame is read, in the same write.
            client.send(frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", window)))
            granted.append(client.read())
        return first, granted, await client.until_ends(1)

    first, granted, rest = run(scenario)
    # The message's 5-byte prefix and its first bytes, as much as the stream's window allows;
    # DATA frames never span the two.
    assert [(item.kind, item.stream, len(item.detail)) for item in first] == [
        ("HEADERS", 1, 3),
        ("DATA", 1, 5),
        ("DATA", 1, window - 5),
    ]
    assert first[0].detail == RESPONSE_HEADERS
    sizes = [[(item.kind, len(item.detail)) for item in frames] for frames in granted]
    body = b"".join(item.detail for item in first[1:]) + b"".join(f.detail for fs in granted for f in fs)
    assert sizes == [[("DATA", window)]] * (len(granted) - 1) + [
        [("DATA", len(body) - window * len(granted))]
    ]
    # The trailers follow the last byte of the message, with no grant of their own.
    assert rest == [Frame("HEADERS", END_HEADERS | END_STREAM, 1, OK_TRAILERS)]
    response = pb.ModelInferResponse.FromString(body[5:])
    np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[0], np.float32), np.arange(8))


def test_settings_that_raise_the_window_are_acknowledged_before_the_data_they_allow(
    run: Callable[..., Any],
) -> None:
    # A client counts its receive windows under the settings we have acknowledged (gRPC core
    # does): bytes the new window allows must follow the ACK, or they overflow the old window.
    window = 16

    async def scenario(session: Session) -> list[Frame]:
        client = session.client
        client.send(PREFACE + frame(SETTINGS, 0, 0, setting(INITIAL_WINDOW_SIZE, window)))
        client.read()
        client.unary(1, "ModelInfer", infer_request(8))
        sent = 0
        while sent < window:  # the answer's first bytes, then it waits for the window
            client.transport.wrote.clear()
            sent += sum(len(item.detail) for item in client.read() if item.kind == "DATA")
            if sent < window:
                await asyncio.wait_for(client.transport.wrote.wait(), 60)
        client.send(frame(SETTINGS, 0, 0, setting(INITIAL_WINDOW_SIZE, 1 << 20)))
        return await client.until_ends(1)

    after = run(scenario)
    assert [(item.kind, item.flags & ACK) for item in after[:2]] == [("SETTINGS", ACK), ("DATA", 0)]
    assert after[-1] == Frame("HEADERS", END_HEADERS | END_STREAM, 1, OK_TRAILERS)


@pytest.mark.parametrize(
    ("increment", "code"),
    [(0, PROTOCOL_ERROR), (2**31 - 1, FLOW_CONTROL_ERROR)],
)
def test_a_bad_window_update_on_a_stream_resets_that_stream(
    run: Callable[..., Any], increment: int, code: int
) -> None:
    async def scenario(session: Session) -> tuple[list[Frame], int]:
        client = await opened(session)
        client.send(frame(HEADERS, END_HEADERS, 1, client.headers_block("ModelInfer")))
        client.send(frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", increment)))
        return client.read(), len(session.connection.calls)

    assert run(scenario) == ([Frame("RST_STREAM", 0, 1, code)], 0)


# PING, RST_STREAM, GOAWAY ------------------------------------------------------------------


def test_a_ping_is_answered_with_its_payload(run: Callable[..., Any]) -> None:
    async def scenario(session: Session) -> list[Frame]:
        client = await opened(session)
        client.send(frame(PING, 0, 0, b"coreserv") + frame(PING, ACK, 0, b"answered"))  # an ACK: no answer
        return client.read()

    assert run(scenario) == [Frame("PING", ACK, 0, b"coreserv")]


def test_a_reset_stream_ends_its_call_and_nothing_answers_it(run: Callable[..., Any]) -> None:
    async def scenario(session: Session) -> tuple[list[Frame], bool, list[Frame]]:
        client = await opened(session)
        # A streaming call: its handler runs from its HEADERS on, waiting for messages.
        client.send(frame(HEADERS, END_HEADERS, 1, client.headers_block("ModelStreamInfer")))
        call = session.connection.calls[1]
        task = call.task
        assert task is not None
        client.send(frame(RST_STREAM, 0, 1, struct.pack(">I", 8)))  # CANCEL
        await asyncio.wait([task])
        after = client.read()
        # Frames that cross the reset are dropped; the connection serves the next stream.
        client.send(frame(DATA, 0, 1, message(b"late")) + frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 1)))
        client.unary(3, "ServerLive", b"")
        return after, call.reset and 1 not in session.connection.calls, await client.until_ends(3)

    after, ended, next_call = run(scenario)
    assert (after, ended) == ([], True)
    assert [(item.kind, item.stream) for item in next_call] == [("HEADERS", 3), ("DATA", 3), ("HEADERS", 3)]


def test_a_reset_after_the_deadline_does_not_cut_the_handlers_cleanup(run: Callable[..., Any]) -> None:
    """The deadline cancels the handler; the client's reset, which follows its own deadline,
    does not cancel it a second time while it cleans up (as grpcio's server). A load ended by
    the deadline closes the instances it created: cut short, it left their Python stubs running."""
    cleaning = asyncio.Event()
    cleaned: list[str] = []

    async def slow_to_stop(request: bytes, context: Any) -> bytes:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cleaning.set()
            await asyncio.sleep(0.05)  # closing what it made
            cleaned.append("all of it")
            raise
        return request

    async def scenario(session: Session) -> list[Frame]:
        client = await opened(session)
        client.unary(1, "SlowToStop", b"", ("grpc-timeout", "20m"))
        task = session.connection.calls[1].task
        assert task is not None
        await asyncio.wait_for(cleaning.wait(), 10)
        client.send(frame(RST_STREAM, 0, 1, struct.pack(">I", 8)))  # CANCEL, at the client's deadline
        await asyncio.wait([task])
        return client.read()

    handler = grpc.unary_unary_rpc_method_handler(slow_to_stop)
    frames = run(scenario, extra={"/inference.GRPCInferenceService/SlowToStop": handler})
    assert cleaned == ["all of it"]
    assert frames == []  # the client is gone: nothing answers it


def test_after_the_clients_goaway_new_streams_are_refused(run: Callable[..., Any]) -> None:
    async def scenario(session: Session) -> list[Frame]:
        client = await opened(session)
        client.send(frame(GOAWAY, 0, 0, struct.pack(">II", 0, NO_ERROR)))
        client.unary(1, "ServerLive", b"")
        return client.read()

    assert run(scenario) == [Frame("RST_STREAM", 0, 1, REFUSED_STREAM)]


def test_shutting_down_says_goaway_and_closes(run: Callable[..., Any]) -> None:
    async def scenario(session: Session) -> tuple[list[Frame], bool, bool]:
        client = await opened(session)
        client.unary(1, "ServerLive", b"")
        await client.until_ends(1)
        await session.connection.shut_down(grace=0)
        return client.read(), session.transport.lost, session.closed == [session.connection]

    assert run(scenario) == ([goaway(NO_ERROR, "", last=1)], True, True)


def _settings(count: int) -> bytes:
    return b"".join(setting(INITIAL_WINDOW_SIZE, 1000 + n) for n in range(count))


def _headers_in_pieces(client: MemoryClient, pieces: int) -> bytes:
    block = client.headers_block("ServerLive")
    first = frame(HEADERS, 0, 1, block[:1])
    middle = b"".join(frame(CONTINUATION, 0, 1, block[1:2]) for _ in range(pieces - 2))
    return first + middle + frame(CONTINUATION, END_HEADERS, 1, block[2:])


# (frames after the opening, GOAWAY code, reason, last stream id)
PROTOCOL_FAULTS: dict[str, tuple[Callable[[MemoryClient], bytes], int, str, int]] = {
    "DATA on stream 0": (lambda c: frame(DATA, 0, 0, b"x"), PROTOCOL_ERROR, "DATA on stream 0", 0),
    "HEADERS on an even stream": (
        lambda c: frame(HEADERS, END_HEADERS, 2, c.headers_block("ServerLive")),
        PROTOCOL_ERROR,
        "stream 2 may not open here",
        0,
    ),
    "HEADERS on a lower stream": (
        lambda c: (
            frame(HEADERS, END_HEADERS, 3, c.headers_block("ModelInfer"))
            + frame(HEADERS, END_HEADERS, 1, c.headers_block("ModelInfer"))
        ),
        PROTOCOL_ERROR,
        "HEADERS on stream 1, not above the last opened (3)",
        3,
    ),
    "RST_STREAM on an idle stream": (
        lambda c: frame(RST_STREAM, 0, 7, struct.pack(">I", 8)),
        PROTOCOL_ERROR,
        "RST_STREAM on idle stream 7",
        0,
    ),
    "PUSH_PROMISE": (
        lambda c: frame(PUSH_PROMISE, 0, 1, bytes(4)),
        PROTOCOL_ERROR,
        "clients may not push",
        0,
    ),
    "CONTINUATION alone": (
        lambda c: frame(CONTINUATION, END_HEADERS, 1, b""),
        PROTOCOL_ERROR,
        "CONTINUATION without its HEADERS",
        0,
    ),
    "a header block interrupted": (
        lambda c: frame(HEADERS, 0, 1, c.headers_block("ServerLive")) + frame(PING, 0, 0, bytes(8)),
        PROTOCOL_ERROR,
        "a header block interrupted",
        0,
    ),
    "a frame over MAX_FRAME_SIZE": (
        lambda c: frame(DATA, 0, 1, bytes(limits.MAX_FRAME_SIZE + 1)),
        FRAME_SIZE_ERROR,
        f"a frame of {limits.MAX_FRAME_SIZE + 1} bytes",
        0,
    ),
    "a PING of 7 bytes": (
        lambda c: frame(PING, 0, 0, bytes(7)),
        FRAME_SIZE_ERROR,
        "a PING of the wrong size",
        0,
    ),
    "a PING on a stream": (lambda c: frame(PING, 0, 1, bytes(8)), PROTOCOL_ERROR, "PING on a stream", 0),
    "a SETTINGS frame of 5 bytes": (
        lambda c: frame(SETTINGS, 0, 0, bytes(5)),
        FRAME_SIZE_ERROR,
        "a SETTINGS frame of the wrong size",
        0,
    ),
    "an initial window past 2^31-1": (
        lambda c: frame(SETTINGS, 0, 0, setting(INITIAL_WINDOW_SIZE, 2**31)),
        FLOW_CONTROL_ERROR,
        "SETTINGS_INITIAL_WINDOW_SIZE past 2^31-1",
        0,
    ),
    "a connection window past 2^31-1": (
        lambda c: frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 2**31 - 1)),
        FLOW_CONTROL_ERROR,
        "connection window past 2^31-1",
        0,
    ),
    "a WINDOW_UPDATE of 0 on the connection": (
        lambda c: frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 0)),
        PROTOCOL_ERROR,
        "a WINDOW_UPDATE of 0",
        0,
    ),
    f"more than {limits.MAX_SETTINGS} settings": (
        lambda c: frame(SETTINGS, 0, 0, _settings(limits.MAX_SETTINGS + 1)),
        ENHANCE_YOUR_CALM,
        f"more than {limits.MAX_SETTINGS} settings in a frame",
        0,
    ),
    f"a header block in more than {limits.MAX_CONTINUATIONS} CONTINUATIONs": (
        lambda c: _headers_in_pieces(c, limits.MAX_CONTINUATIONS + 2),
        ENHANCE_YOUR_CALM,
        f"a header block in {limits.MAX_CONTINUATIONS + 1} frames",
        0,
    ),
    "a header block over MAX_HEADER_BLOCK": (
        lambda c: frame(HEADERS, END_HEADERS, 1, bytes(limits.MAX_HEADER_BLOCK + 1)),
        ENHANCE_YOUR_CALM,
        f"a header block over {limits.MAX_HEADER_BLOCK} bytes",
        0,
    ),
}


@pytest.mark.parametrize("fault", PROTOCOL_FAULTS)
def test_a_protocol_error_ends_the_connection_with_goaway_and_rfc_9113s_code(
    run: Callable[..., Any], fault: str
) -> None:
    build, code, reason, last = PROTOCOL_FAULTS[fault]

    async def scenario(session: Session) -> tuple[list[Frame], bool, bool]:
        client = await opened(session)
        client.send(build(client))
        frames = client.read()
        await asyncio.sleep(0)  # the transport reports the close on the loop's next turn
        return frames, session.transport.lost, session.connection.calls == {}

    assert run(scenario) == ([goaway(code, reason, last)], True, True)


# Limits ------------------------------------------------------------------------------------


def test_one_turn_reads_at_most_streams_per_turn_new_streams(run: Callable[..., Any]) -> None:
    streams = 2 * limits.STREAMS_PER_TURN + 1

    async def scenario(session: Session) -> list[tuple[int, bool]]:
        client = await opened(session)
        block = client.headers_block("ModelInfer")
        client.send(b"".join(frame(HEADERS, END_HEADERS, 2 * n + 1, block) for n in range(streams)))
        seen = [(len(session.connection.calls), session.transport.reading)]
        for _ in range(2):
            await asyncio.sleep(0)  # the loop's next turn reads the next share
            seen.append((len(session.connection.calls), session.transport.reading))
        return seen

    per_turn = limits.STREAMS_PER_TURN
    # Reading pauses while frames wait in the buffer, and resumes once they are read.
    assert run(scenario) == [(per_turn, False), (2 * per_turn, False), (streams, True)]


def test_streams_past_max_concurrent_are_refused(run: Callable[..., Any]) -> None:
    async def scenario(session: Session) -> tuple[int, list[Frame]]:
        client = await opened(session)
        block = client.headers_block("ModelInfer")  # unary, no END_STREAM: each call stays open
        for first in range(0, limits.MAX_CONCURRENT + 1, limits.STREAMS_PER_TURN):
            last = min(first + limits.STREAMS_PER_TURN, limits.MAX_CONCURRENT + 1)
            client.send(b"".join(frame(HEADERS, END_HEADERS, 2 * n + 1, block) for n in range(first, last)))
        return len(session.connection.calls), client.read()

    refused_stream = 2 * limits.MAX_CONCURRENT + 1
    assert run(scenario) == (limits.MAX_CONCURRENT, [Frame("RST_STREAM", 0, refused_stream, REFUSED_STREAM)])


def test_a_client_that_does_not_read_is_not_read_from(run: Callable[..., Any]) -> None:
    async def scenario(session: Session) -> list[bool]:
        await opened(session)
        seen = []
        session.connection.pause_writing()  # the transport's buffer is full
        seen.append(session.transport.reading)
        session.connection.resume_writing()
        seen.append(session.transport.reading)
        return seen

    assert run(scenario) == [False, True]


def test_a_rapid_reset_flood_ends_the_connection_past_the_stream_budget(
    run_still: Callable[..., Any],
) -> None:
    async def scenario(session: Session) -> tuple[list[Frame], int, list[Frame]]:
        client = await opened(session)
        block = client.headers_block("ModelInfer")

        def opened_and_reset(streams: range) -> bytes:
            cancel = struct.pack(">I", 8)
            return b"".join(
                frame(HEADERS, END_HEADERS, 2 * n + 1, block) + frame(RST_STREAM, 0, 2 * n + 1, cancel)
                for n in streams
            )

        budget = limits.STREAM_CHURN_BURST
        for first in range(0, budget, limits.STREAMS_PER_TURN):
            client.send(opened_and_reset(range(first, min(first + limits.STREAMS_PER_TURN, budget))))
        within = client.read()
        calls = len(session.connection.calls)
        client.send(opened_and_reset(range(budget, budget + 1)))
        return within, calls, client.read()

    within, calls, past = run_still(scenario)
    last = 2 * limits.STREAM_CHURN_BURST + 1
    assert (within, calls) == ([], 0)
    assert past == [goaway(ENHANCE_YOUR_CALM, "too many streams reset or refused", last)]


def test_a_flood_of_frames_that_carry_nothing_ends_the_connection_past_the_glitch_budget(
    run_still: Callable[..., Any],
) -> None:
    async def scenario(session: Session) -> tuple[list[Frame], list[Frame]]:
        client = await opened(session)
        priority = frame(PRIORITY, 0, 1, bytes(5))  # RFC 9113 deprecates the scheme: read, then dropped
        chunk = 500  # frames per read, within limits.FRAMES_PER_TURN
        for _ in range(limits.GLITCH_BURST // chunk):
            client.send(priority * chunk)
        within = client.read()
        client.send(priority)
        return within, client.read()

    assert limits.GLITCH_BURST % 500 == 0 and limits.FRAMES_PER_TURN >= 500
    within, past = run_still(scenario)
    assert (within, past) == ([], [goaway(ENHANCE_YOUR_CALM, "too many PRIORITY frames")])
