"""The native gRPC server (`--grpc-server native`) on the wire: raw HTTP/2 frames and real clients.

Raw frames check what grpc's clients never send: bad prefaces, garbage frames, oversized header
blocks, streams reset mid-message, tiny flow-control windows. Each attack checks its answer,
that the server keeps serving (a health probe over HTTP asks it during the attack, and a
real client's call succeeds after it) and that the log holds no traceback.
"""

from __future__ import annotations

import gzip
import shutil
import socket
import struct
import subprocess
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from coreserve.protos import grpc_service_pb2 as pb
from coreserve.testing import ServerFactory, ServerProcess
from support.model_builders import identity_model, write_model
from support.wire.closing import closed_by_server, still_open
from support.wire.health_probe import HealthProbe
from support.wire.http2_raw import (
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    IDENTITY,
    OPENING,
    PADDED,
    PING,
    PREFACE,
    RST_STREAM,
    SERVICE,
    SETTINGS,
    WINDOW_UPDATE,
    RawHttp2,
    assert_identity_answers,
    frame,
    identity_server,
    infer_request,
    message,
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = identity_server(tmp_path_factory.mktemp("grpc-native"))
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


def test_a_call_in_padded_and_continued_frames(raw: RawHttp2) -> None:
    raw.open()
    block = raw.headers_block("ModelInfer")
    padded = bytes([3]) + block[:10] + b"\0\0\0"
    raw.send(frame(HEADERS, PADDED, 1, padded) + frame(CONTINUATION, END_HEADERS, 1, block[10:]))
    body = message(infer_request(4))
    raw.send(frame(DATA, 0, 1, body[:7]) + frame(DATA, END_STREAM, 1, body[7:]))
    fields, answer = raw.call(1)
    assert fields[":status"] == "200" and fields["grpc-status"] == "0", fields
    response = pb.ModelInferResponse.FromString(answer[5:])
    assert np.frombuffer(response.raw_output_contents[0], np.float32).tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("attack", "code"),
    [
        (b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n", 0x1),  # not a preface: PROTOCOL_ERROR
        (OPENING + frame(CONTINUATION, END_HEADERS, 1, b"x"), 0x1),  # no HEADERS before it
        (OPENING + b"\xff\xff\xff\x00\x00\x00\x00\x00\x01", 0x6),  # a 16 MiB frame: FRAME_SIZE_ERROR
        (OPENING + frame(HEADERS, END_HEADERS, 1, b"\xff\xff\xff\xff\x0f"), 0x9),  # HPACK: COMPRESSION
        (OPENING + frame(HEADERS, END_HEADERS, 2, b"\x83"), 0x1),  # an even stream id
        (OPENING + frame(DATA, 0, 7, b"abc"), 0x1),  # DATA on a stream never opened
        (PREFACE + frame(SETTINGS, 0, 0, b"\x00\x04"), 0x6),  # SETTINGS of a bad length
        (OPENING + frame(PING, 0, 0, b"1234"), 0x6),  # a short PING: FRAME_SIZE_ERROR
        (OPENING + frame(WINDOW_UPDATE, 0, 0, b"\x00\x00\x00\x00"), 0x1),  # an increment of 0
    ],
    ids=[
        "bad-preface",
        "stray-continuation",
        "huge-frame",
        "bad-hpack",
        "even-stream",
        "idle-data",
        "bad-settings",
        "short-ping",
        "zero-window-update",
    ],
)
def test_garbage_gets_goaway_and_the_server_keeps_serving(
    server: ServerProcess, raw: RawHttp2, attack: bytes, code: int
) -> None:
    with HealthProbe(server):
        raw.send(attack)
        assert raw.goaway_code() == code


def test_random_bytes_after_the_preface_never_stop_the_server(server: ServerProcess) -> None:
    generator = np.random.default_rng(16)
    with HealthProbe(server):
        for _ in range(30):
            connection = RawHttp2(server)
            try:
                connection.send(PREFACE + generator.bytes(int(generator.integers(1, 400))))
                connection.sock.shutdown(socket.SHUT_WR)
                for _frame in connection.frames(5.0):
                    pass  # the server answers or closes; it never hangs the probe
            finally:
                connection.close()


def test_an_oversized_header_block_ends_the_connection(server: ServerProcess, raw: RawHttp2) -> None:
    raw.open()
    with HealthProbe(server):
        raw.send(frame(HEADERS, 0, 1, raw.headers_block("ServerLive")))
        chunk = b"\0" * 16000
        # 48 kB of CONTINUATION, over the 32 KiB a block may have
        raw.send(b"".join(frame(CONTINUATION, 0, 1, chunk) for _ in range(3)))
        assert raw.goaway_code() == 0xB  # ENHANCE_YOUR_CALM


def test_too_much_metadata_is_resource_exhausted(raw: RawHttp2) -> None:
    raw.open()
    block = raw.headers_block("ServerLive", *((f"x-meta-{i}", "v" * 1000) for i in range(20)))
    raw.send(frame(HEADERS, END_HEADERS, 1, block) + frame(DATA, END_STREAM, 1, message(b"")))
    fields, _ = raw.call(1)
    assert fields["grpc-status"] == str(grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]), fields
    assert "header list" in fields["grpc-message"]


def test_a_stream_reset_mid_message_leaves_the_connection_serving(raw: RawHttp2) -> None:
    raw.open()
    body = message(infer_request(1024))
    raw.send(frame(HEADERS, END_HEADERS, 1, raw.headers_block("ModelInfer")) + frame(DATA, 0, 1, body[:100]))
    raw.send(frame(RST_STREAM, 0, 1, struct.pack(">I", 0x8)))  # CANCEL
    raw.send(frame(DATA, 0, 1, body[100:200]))  # late bytes of the reset stream: ignored
    raw.send(
        frame(HEADERS, END_HEADERS, 3, raw.headers_block("ServerLive"))
        + frame(DATA, END_STREAM, 3, message(b""))
    )
    fields, answer = raw.call(3)
    assert fields["grpc-status"] == "0"
    assert pb.ServerLiveResponse.FromString(answer[5:]).live


def test_a_deadline_that_passes_before_the_request_arrives(raw: RawHttp2) -> None:
    raw.open()
    raw.send(frame(HEADERS, END_HEADERS, 1, raw.headers_block("ModelInfer", ("grpc-timeout", "50m"))))
    fields, _ = raw.call(1)
    assert fields["grpc-status"] == str(grpc.StatusCode.DEADLINE_EXCEEDED.value[0]), fields


@pytest.mark.parametrize("method", ["ServerLive", "ModelInfer"])
def test_a_deadline_already_past_is_answered_deadline_exceeded(raw: RawHttp2, method: str) -> None:
    raw.open()
    body = message(b"" if method == "ServerLive" else infer_request(4))
    for stream_id, timeout in ((1, "0n"), (3, "1n"), (5, "1u")):
        block = raw.headers_block(method, ("grpc-timeout", timeout))
        raw.send(frame(HEADERS, END_HEADERS, stream_id, block) + frame(DATA, END_STREAM, stream_id, body))
        fields, _ = raw.call(stream_id)
        expired = (str(grpc.StatusCode.DEADLINE_EXCEEDED.value[0]), "Deadline Exceeded")
        assert (fields["grpc-status"], fields["grpc-message"]) == expired, (timeout, fields)


def test_not_grpc_and_unknown_methods(raw: RawHttp2) -> None:
    raw.open()
    block = raw.encoder.encode(
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/x"),
            (":authority", "t"),
            ("content-type", "application/json"),
        ]
    )
    raw.send(frame(HEADERS, END_HEADERS | END_STREAM, 1, bytes(block)))
    assert raw.call(1)[0][":status"] == "415"
    raw.send(
        frame(HEADERS, END_HEADERS, 3, raw.headers_block("NoSuchMethod"))
        + frame(DATA, END_STREAM, 3, message(b""))
    )
    fields, _ = raw.call(3)
    assert fields["grpc-status"] == str(grpc.StatusCode.UNIMPLEMENTED.value[0])


def test_answers_wait_for_the_clients_flow_control_windows(raw: RawHttp2) -> None:
    # The client allows 1000 bytes per stream: a 160 kB answer comes in window-sized pieces,
    # each after a WINDOW_UPDATE, and is whole at the end.
    raw.open(struct.pack(">HI", 0x4, 1000))
    raw.send(frame(HEADERS, END_HEADERS, 1, raw.headers_block("ModelInfer")))
    raw.send(frame(DATA, END_STREAM, 1, message(infer_request(40000))))
    _, body, pieces = raw.granted_call(1, 1000)
    response = pb.ModelInferResponse.FromString(body[5:])
    assert np.frombuffer(response.raw_output_contents[0], np.float32).size == 40000
    assert pieces > 100


def test_stream_answers_keep_their_order_when_the_window_holds_some_back(raw: RawHttp2) -> None:
    # A stream's answers go out as they come where nothing of the stream waits before them, and
    # are queued behind the held-back bytes where something does: with 1000 bytes per window,
    # small answers fit, large ones wait for WINDOW_UPDATEs, and each comes in request order.
    raw.open(struct.pack(">HI", 0x4, 1000))
    raw.send(frame(HEADERS, END_HEADERS, 1, raw.headers_block("ModelStreamInfer")))
    sizes = [4, 3000, 2, 1, 5000, 3, 8, 700, 1, 2]
    requests = []
    for index, values in enumerate(sizes):
        request = pb.ModelInferRequest.FromString(infer_request(values))
        request.id = str(index)
        requests.append(message(request.SerializeToString()))
    raw.send(frame(DATA, END_STREAM, 1, b"".join(requests)))
    trailers, body, _ = raw.granted_call(1, 1000)
    assert trailers == [("grpc-status", "0")]
    answers = []
    while body:
        length = int.from_bytes(body[1:5], "big")
        answers.append(pb.ModelStreamInferResponse.FromString(body[5 : 5 + length]))
        body = body[5 + length :]
    assert [answer.error_message for answer in answers] == [""] * len(sizes)
    assert [answer.infer_response.id for answer in answers] == [str(index) for index in range(len(sizes))]
    received = [np.frombuffer(a.infer_response.raw_output_contents[0], np.float32) for a in answers]
    assert [values.tolist() for values in received] == [list(range(n)) for n in sizes]


def test_many_concurrent_calls_and_16_mib_both_ways(server: ServerProcess) -> None:
    large = np.random.default_rng(0).random(4 * 1024 * 1024, dtype=np.float32)  # 16 MiB

    def infer(data: np.ndarray) -> np.ndarray:
        tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        return client.infer("identity", [tensor]).as_numpy("OUTPUT0")

    client = grpcclient.InferenceServerClient(server.grpc_url)  # one channel: streams of one connection
    try:
        with ThreadPoolExecutor(32) as pool:
            small = [np.full(16, i, np.float32) for i in range(256)]
            for sent, got in zip(small, pool.map(infer, small), strict=True):
                np.testing.assert_array_equal(got, sent)
            results = list(pool.map(infer, [large] * 3))
        for result in results:
            np.testing.assert_array_equal(result, large)
    finally:
        client.close()


def test_gzip_requests_are_read(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.grpc_url, compression=grpc.Compression.Gzip) as channel:
        call = channel.unary_unary(SERVICE + "ModelInfer")
        answer = call(infer_request(1000), timeout=30)
    response = pb.ModelInferResponse.FromString(answer)
    assert np.frombuffer(response.raw_output_contents[0], np.float32).tolist() == list(range(1000))


@pytest.mark.parametrize(
    ("flags", "env", "native"),
    [
        ([], {}, True),  # the default
        ([], {"CORESERVE_GRPC_SERVER": "grpcio"}, False),
        (["--grpc-server=grpcio"], {"CORESERVE_GRPC_SERVER": "native"}, False),  # the flag wins
    ],
    ids=["default", "environment", "flag"],
)
def test_the_native_server_serves_unless_told_otherwise(
    coreserve_server: ServerFactory, tmp_path: Path, flags: list[str], env: dict[str, str], native: bool
) -> None:
    server = coreserve_server(
        tmp_path, "--allow-metrics=false", *flags, env={"CORESERVE_GRPC_SERVER": "", **env}
    )
    assert ("(native HTTP/2)" in server.log) == native
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        assert client.is_server_live()


def _native(coreserve_server, tmp_path: Path, *flags: str) -> ServerProcess:  # type: ignore[no-untyped-def]
    write_model(tmp_path, "identity", identity_model("FP32", ["n"]), IDENTITY)
    return coreserve_server(tmp_path, "--grpc-server=native", "--allow-metrics=false", *flags)


def test_keepalive_pings_and_a_client_that_never_answers_is_dropped(coreserve_server, tmp_path: Path) -> None:
    server = _native(
        coreserve_server,
        tmp_path,
        "--grpc-keepalive-time=200",
        "--grpc-keepalive-timeout=500",
        "--grpc-keepalive-permit-without-calls=true",
    )
    connection = RawHttp2(server)
    try:
        connection.open()
        # Read until the server closes, or the socket's 10 s deadline passes: the connection's frames
        # are its SETTINGS, then the PINGs it never got an answer to, and no GOAWAY (a
        # keepalive timeout drops the connection without a word).
        kinds = [(kind, flags) for kind, flags, _sid, _payload in connection.frames()]
        assert connection.closed, "the connection was not closed after the keepalive timeout"
        assert (PING, 0) in kinds, f"no keepalive PING came: {kinds}"
        assert {kind for kind, _flags in kinds} <= {SETTINGS, PING, WINDOW_UPDATE}, kinds
    finally:
        connection.close()


@pytest.mark.parametrize("grpc_server", ["native", "grpcio"])
def test_a_connection_that_never_sends_the_preface_is_dropped(
    coreserve_server: ServerFactory, tmp_path: Path, grpc_server: str
) -> None:
    write_model(tmp_path, "identity", identity_model("FP32", ["n"]), IDENTITY)
    flags = (f"--grpc-server={grpc_server}", "--allow-metrics=false", "--grpc-handshake-timeout-secs=0.5")
    server = coreserve_server(tmp_path, *flags)
    talking = RawHttp2(server)
    try:
        talking.open()
        host, port = server.grpc_url.rsplit(":", 1)
        with socket.create_connection((host, int(port))) as silent:
            assert still_open(silent)  # not closed at once
            assert closed_by_server(silent, 30.0)  # but once the handshake's time ran out
        # The connection that sent its preface is past its handshake: it is still served.
        talking.send(frame(HEADERS, END_HEADERS, 1, talking.headers_block("ModelInfer")))
        talking.send(frame(DATA, END_STREAM, 1, message(infer_request(4))))
        fields, _ = talking.call(1)
        assert fields["grpc-status"] == "0", fields
    finally:
        talking.close()
    assert "Traceback" not in server.log, server.log[-3000:]


def test_a_client_that_pings_too_often_gets_goaway_too_many_pings(coreserve_server, tmp_path: Path) -> None:
    server = _native(
        coreserve_server,
        tmp_path,
        "--grpc-http2-min-recv-ping-interval-without-data=60000",
        "--grpc-http2-max-ping-strikes=1",
    )
    connection = RawHttp2(server)
    try:
        connection.open()
        connection.send(b"".join(frame(PING, 0, 0, b"%08d" % i) for i in range(4)))
        assert connection.goaway_code() == 0xB
    finally:
        connection.close()


def test_max_connection_age_sends_goaway_then_closes(coreserve_server, tmp_path: Path) -> None:
    server = _native(
        coreserve_server, tmp_path, "--grpc-max-connection-age=300", "--grpc-max-connection-age-grace=300"
    )
    connection = RawHttp2(server)
    try:
        connection.open()
        assert connection.goaway_code() == 0  # NO_ERROR, and the connection ended (frames() returned)
    finally:
        connection.close()


def test_inference_answers_are_gzipped_at_the_compression_level_asked(
    coreserve_server, tmp_path: Path
) -> None:
    server = _native(coreserve_server, tmp_path, "--grpc-infer-response-compression-level=high")
    connection = RawHttp2(server)
    try:
        connection.open()
        block = connection.headers_block("ModelInfer", ("grpc-accept-encoding", "identity,gzip"))
        connection.send(
            frame(HEADERS, END_HEADERS, 1, block) + frame(DATA, END_STREAM, 1, message(infer_request(4096)))
        )
        fields, answer = connection.call(1)
    finally:
        connection.close()
    assert fields["grpc-encoding"] == "gzip" and fields["grpc-status"] == "0", fields
    assert answer[0] == 1  # the compressed flag
    response = pb.ModelInferResponse.FromString(gzip.decompress(answer[5:]))
    assert np.frombuffer(response.raw_output_contents[0], np.float32).tolist() == list(range(4096))
    with grpc.insecure_channel(server.grpc_url) as channel:  # grpc's own client reads it as well
        # (400 KB: an answer large enough to be sent in pieces, joined to be compressed)
        answer = channel.unary_unary(SERVICE + "ModelInfer")(infer_request(100_000), timeout=30)
    contents = pb.ModelInferResponse.FromString(answer).raw_output_contents[0]
    assert np.frombuffer(contents, np.float32).tolist() == list(range(100_000))


def test_answers_larger_than_the_socket_buffers_end_once_the_client_reads(raw: RawHttp2) -> None:
    # Windows wide open: each 16 MiB answer of a stream goes to the transport, which pauses
    # while the client reads nothing; the next answers and the trailers must still come once
    # the client reads (the handler held back by the paused transport is woken). The server
    # stops reading while it cannot write, so the requests go from a thread of their own, as an
    # HTTP/2 client sends while it reads.
    raw.open(struct.pack(">HI", 0x4, 2**31 - 1))
    raw.acknowledge_settings()  # the reader below must not block on a write
    raw.send(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 2**31 - 1 - 65535)))
    raw.send(frame(HEADERS, END_HEADERS, 1, raw.headers_block("ModelStreamInfer")))
    body = message(infer_request(4 * 1024 * 1024)) * 3
    step = 1 << 20  # the server's largest frame

    def send_requests() -> None:
        for start in range(0, len(body), step):
            last = start + step >= len(body)
            raw.send(frame(DATA, END_STREAM if last else 0, 1, body[start : start + step]))

    with ThreadPoolExecutor(1) as sender:
        sent = sender.submit(send_requests)
        time.sleep(1.0)
        fields, answers = raw.call(1, seconds=60)
        sent.result()
    assert fields.get("grpc-status") == "0", fields
    assert len(answers) == 3 * (
        5
        + len(
            pb.ModelStreamInferResponse.FromString(
                answers[5 : 5 + int.from_bytes(answers[1:5], "big")]
            ).SerializeToString()
        )
    )


# HPACK of the answers (grpc/native/headers/response.py) -------------------------------------------------

HEADER_TABLE_SIZE = 0x1
OK_FIELDS = [(":status", "200"), ("content-type", "application/grpc")]
# Before a message, as Triton's answers: the encodings the server reads (not in trailers only).
HEADER_FIELDS = [*OK_FIELDS, ("grpc-accept-encoding", "identity, deflate, gzip")]


def answer_blocks(raw: RawHttp2, stream_ids: set[int], grant: int | None = None) -> dict[int, list[bytes]]:
    """Reads until every stream of `stream_ids` ends: each stream's header blocks, as sent.
    The blocks of all streams are decoded in the order they come (as a client's decoder must)
    and checked against what each stream should end with; `grant`: once every stream but
    stream 1 has ended, stream 1 and the connection get this many bytes of window."""
    blocks: dict[int, list[bytes]] = {stream_id: [] for stream_id in stream_ids}
    ended: set[int] = set()
    for kind, flags, sid, payload in raw.frames():
        if kind == SETTINGS and not flags & 1:
            raw.send(frame(SETTINGS, 1, 0))
        if kind == HEADERS and sid in blocks:
            blocks[sid].append(payload)
            fields = raw.decoder.decode(payload)
            assert fields in (HEADER_FIELDS, [("grpc-status", "0")], [*OK_FIELDS, ("grpc-status", "0")]), (
                fields
            )
        if sid in blocks and flags & END_STREAM and kind in (HEADERS, DATA):
            ended.add(sid)
            if grant is not None and ended == stream_ids - {1}:
                raw.send(
                    frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", grant))
                    + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", grant))
                )
        if ended == stream_ids:
            return blocks
    raise AssertionError(f"streams {stream_ids - ended} did not end")


def send_infer(raw: RawHttp2, stream_id: int, values: int = 4) -> None:
    raw.send(
        frame(HEADERS, END_HEADERS, stream_id, raw.headers_block("ModelInfer"))
        + frame(DATA, END_STREAM, stream_id, message(infer_request(values)))
    )


def test_later_answers_name_the_fields_every_answer_repeats_by_index(raw: RawHttp2) -> None:
    # As grpc's own servers (Triton's) do: the first answer adds content-type,
    # grpc-accept-encoding and grpc-status 0 to the client's HPACK table, later ones name each
    # in one byte.
    raw.open()
    sizes = []
    for stream_id in (1, 3, 5):
        send_infer(raw, stream_id)
        headers, trailers = answer_blocks(raw, {stream_id})[stream_id]
        sizes.append((len(headers), len(trailers)))
    assert sizes[1] == sizes[2] == (3, 1)
    assert sizes[0][0] > 50 and sizes[0][1] > 10


def test_the_table_is_shared_by_the_answers_of_streams_that_interleave(raw: RawHttp2) -> None:
    # Stream 1's answer waits for window (1000 bytes per stream) after its headers, while
    # stream 3's whole answer goes out, then stream 1's ends: the fields one stream's blocks
    # add are named by the other's, and every block must decode in the order it comes.
    raw.open(struct.pack(">HI", 0x4, 1000))
    send_infer(raw, 1, 40000)
    send_infer(raw, 3)
    blocks = answer_blocks(raw, {1, 3}, grant=400_000)
    assert len(blocks[1]) == len(blocks[3]) == 2


# A dynamic table size update to each size, as RFC 7541 (5.1, 6.3) writes it.
SIZE_UPDATES = {0: b"\x20", 100: b"\x3f\x45", 200: b"\x3f\xa9\x01"}


@pytest.mark.parametrize("table_size", [0, 100, 200])
def test_a_client_that_shrinks_its_header_table_gets_a_size_update_first(
    raw: RawHttp2, table_size: int
) -> None:
    # RFC 7541 4.2: after a smaller SETTINGS_HEADER_TABLE_SIZE the next block starts with a
    # dynamic table size update. Below what the three fields need (179 bytes) nothing is
    # indexed any more; at 200 all three stay in the table.
    raw.open()
    send_infer(raw, 1)
    answer_blocks(raw, {1})
    raw.send(frame(SETTINGS, 0, 0, struct.pack(">HI", HEADER_TABLE_SIZE, table_size)))
    for stream_id in (3, 5):
        send_infer(raw, stream_id)
        headers, trailers = answer_blocks(raw, {stream_id})[stream_id]
        assert headers.startswith(SIZE_UPDATES[table_size]) == (stream_id == 3)
        assert raw.decoder.header_table_size == table_size
        assert len(trailers) == (1 if table_size == 200 else len(b"\x00\x0bgrpc-status\x010"))


def test_a_client_that_raises_its_header_table_keeps_the_indexed_fields(raw: RawHttp2) -> None:
    # The largest value a SETTINGS entry holds: the fields stay indexed, no update is sent.
    raw.open()
    send_infer(raw, 1)
    answer_blocks(raw, {1})
    raw.send(frame(SETTINGS, 0, 0, struct.pack(">HI", HEADER_TABLE_SIZE, 2**32 - 1)))
    send_infer(raw, 3)
    headers, trailers = answer_blocks(raw, {3})[3]
    assert (len(headers), len(trailers)) == (3, 1)


def test_a_client_with_no_header_table_from_the_start(raw: RawHttp2) -> None:
    raw.open(struct.pack(">HI", HEADER_TABLE_SIZE, 0))
    for stream_id in (1, 3):
        send_infer(raw, stream_id)
        headers, trailers = answer_blocks(raw, {stream_id})[stream_id]
        assert headers.startswith(b"\x20") == (stream_id == 1)
        assert len(trailers) > 10


@pytest.mark.skipif(shutil.which("h2load") is None, reason="needs h2load (Debian's nghttp2-client)")
@pytest.mark.parametrize("table_size", [4096, 200, 100, 0])
def test_nghttp2_decodes_every_answer_at_any_header_table_size(
    server: ServerProcess, table_size: int
) -> None:
    # nghttp2's decoder is strict: a block after a smaller table size that lacks the size
    # update is a COMPRESSION_ERROR, and every request of the connection fails.
    body = message(infer_request(4))
    with tempfile.NamedTemporaryFile() as file:
        file.write(body)
        file.flush()
        completed = subprocess.run(
            ["h2load", "-n8", "-c1", "-m2", f"--header-table-size={table_size}", "-d", file.name,
             "-H", "content-type: application/grpc", "-H", "te: trailers",
             f"http://{server.grpc_url}{SERVICE}ModelInfer"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert "8 succeeded, 0 failed" in completed.stdout, completed.stdout
