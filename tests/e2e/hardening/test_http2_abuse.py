"""Attacks on the native gRPC server's HTTP/2, each bounded, each with what the server must do.

The attacks of the 2019-2024 HTTP/2 denial-of-service reports (HPACK bombs, rapid reset,
CONTINUATION and empty-frame floods, PING and SETTINGS floods, compression bombs), sent with
raw frames. Each test checks the GOAWAY or RST_STREAM code the references (nghttp2, grpc's
core) answer with, a bound on the server's memory where the attack aims at it, and that
another client is served during the attack (counts and answers: every call of a bystander
succeeds, the HTTP health probe answers). Latency under attack is measured by
benchmarks/attacks/http2_attacks.py, not here.
"""

from __future__ import annotations

import gzip
import re
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from coreserve.testing import ServerProcess
from support.wire.health_probe import HealthProbe
from support.wire.http2_raw import (
    ACK,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    GOAWAY,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    PING,
    PRIORITY,
    REFUSED_STREAM,
    RST_STREAM,
    SERVICE,
    SETTINGS,
    RawHttp2,
    frame,
    identity_server,
    infer_request,
    message,
    setting,
)

RESOURCE_EXHAUSTED = str(grpc.StatusCode.RESOURCE_EXHAUSTED.value[0])
INTERNAL = str(grpc.StatusCode.INTERNAL.value[0])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = identity_server(tmp_path_factory.mktemp("h2-abuse"))
    yield process
    process.close()


@pytest.fixture(autouse=True)
def _no_traceback(server: ServerProcess) -> Iterator[None]:
    yield
    assert "Traceback" not in server.log, server.log[-3000:]


@pytest.fixture
def raw(server: ServerProcess) -> Iterator[RawHttp2]:
    connection = RawHttp2(server)
    yield connection
    connection.close()


def rss_mib(server: ServerProcess) -> float:
    assert server.process is not None
    status = Path(f"/proc/{server.process.pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]


def cpu_seconds(server: ServerProcess) -> float:
    assert server.process is not None
    fields = Path(f"/proc/{server.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, in clock ticks of 1/100 s


class Bystander:
    """A well-behaved gRPC client calling the server over and over while an attack runs: every
    call must succeed with the right answer."""

    def __init__(self, server: ServerProcess) -> None:
        self._client = grpcclient.InferenceServerClient(server.grpc_url)
        self.answered = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        data = np.arange(16, dtype=np.float32)
        tensor = grpcclient.InferInput("INPUT0", [16], "FP32")
        tensor.set_data_from_numpy(data)
        while not self._stop.is_set() and self.answered < 100_000:
            try:
                result = self._client.infer("identity", [tensor], client_timeout=30)
            except Exception as exc:
                self.failures.append(repr(exc))
                return
            if result.as_numpy("OUTPUT0").tolist() != data.tolist():
                self.failures.append("a wrong answer")
            self.answered += 1

    def __enter__(self) -> Bystander:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        # A short attack may end before the first call does (it opens the channel): that call
        # still has to come back.
        deadline = time.monotonic() + 30
        while not self.answered and not self.failures and time.monotonic() < deadline:
            time.sleep(0.01)
        self._stop.set()
        self._thread.join(60)
        self._client.close()
        assert not self.failures, self.failures
        assert self.answered, "the bystander got no answer"


def one_call_answers(raw: RawHttp2, stream_id: int) -> None:
    raw.send(
        frame(HEADERS, END_HEADERS, stream_id, raw.headers_block("ModelInfer"))
        + frame(DATA, END_STREAM, stream_id, message(infer_request(4)))
    )
    kind, fields = raw.outcome(stream_id)
    assert kind == "answer" and fields["grpc-status"] == "0", (kind, fields)  # type: ignore[index]


# HPACK bomb ----------------------------------------------------------------------------------


def unindexed_request(path: str) -> bytes:
    """A request's fields that leave the HPACK table alone: static-table references, and
    literals without indexing (RFC 7541 6.1, 6.2.2) for :path and content-type."""
    literal_path = b"\x04" + bytes([len(path)]) + path.encode()  # name: static entry 4
    content_type = b"\x0f\x10\x10application/grpc"  # name: static entry 31
    return b"\x83\x86" + literal_path + content_type  # :method POST, :scheme http


def bomb_ready(raw: RawHttp2) -> bytes:
    """Opens the connection and puts a 4 KB entry in the dynamic tables of both sides; the byte
    that names it."""
    raw.open()
    entry = ("x-bomb", "b" * 4000)
    raw.send(
        frame(HEADERS, END_HEADERS, 1, raw.headers_block("ServerLive", entry))
        + frame(DATA, END_STREAM, 1, message(b""))
    )
    assert raw.outcome(1)[0] == "answer"
    entries = raw.encoder.header_table.dynamic_entries
    index = next(i for i, field in enumerate(entries, 62) if field[0] == b"x-bomb")
    assert index < 127
    return bytes([0x80 | index])  # an indexed field, in one byte


def test_a_header_list_past_the_limit_is_refused_and_the_tables_stay_in_step(raw: RawHttp2) -> None:
    # 7 names of the 4 KB entry: 28 kB, past the 16 KiB limit and within twice it. The fields
    # past the limit are counted, not kept; the call is RESOURCE_EXHAUSTED, the connection goes on.
    bomb = bomb_ready(raw)
    for stream_id in (3, 5):
        raw.send(
            frame(
                HEADERS,
                END_HEADERS | END_STREAM,
                stream_id,
                unindexed_request(SERVICE + "ServerLive") + bomb * 7,
            )
        )
        kind, fields = raw.outcome(stream_id)
        assert kind == "answer" and fields["grpc-status"] == RESOURCE_EXHAUSTED, (kind, fields)  # type: ignore[index]
    one_call_answers(raw, 7)  # the HPACK tables of both sides still agree


def test_an_hpack_bomb_ends_its_connection_at_twice_the_limit(server: ServerProcess) -> None:
    # Blocks of 32 kB that name the 4 KB entry 32,000 times each: 130 MB per block if they were
    # decoded whole. Decoding stops past 32 KiB (the ninth name): GOAWAY ENHANCE_YOUR_CALM, no
    # memory kept, and an attacker who reconnects costs the others nothing they notice.
    before = rss_mib(server)
    with Bystander(server), HealthProbe(server):
        for _ in range(20):
            raw = RawHttp2(server)
            try:
                bomb = bomb_ready(raw)
                block = unindexed_request(SERVICE + "ServerLive") + bomb * 32_000
                with suppress(OSError):
                    raw.send(frame(HEADERS, END_HEADERS | END_STREAM, 3, block) * 8)
                assert raw.goaway_code() == ENHANCE_YOUR_CALM
            finally:
                raw.close()
    assert rss_mib(server) - before < 30, f"{rss_mib(server) - before:.0f} MiB more after the bombs"


# Rapid reset (CVE-2023-44487) ----------------------------------------------------------------


def rapid_resets(raw: RawHttp2, count: int, first: int = 1) -> bytes:
    """`count` calls, each sent whole and reset at once, as one burst of bytes."""
    block = raw.headers_block("ModelInfer")
    body = frame(DATA, END_STREAM, 0, message(infer_request(4)))[9:]
    cancel = struct.pack(">I", 0x8)
    return b"".join(
        frame(HEADERS, END_HEADERS, stream_id, block)
        + frame(DATA, END_STREAM, stream_id, body)
        + frame(RST_STREAM, 0, stream_id, cancel)
        for stream_id in range(first, first + 2 * count, 2)
    )


def inference_count(server: ServerProcess) -> int:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        statistics = client.get_inference_statistics("identity").model_stats
    return sum(stats.inference_count for stats in statistics)


def test_rapid_reset_gets_goaway_enhance_your_calm_and_its_work_is_cancelled(server: ServerProcess) -> None:
    # nghttp2's budget: 1000 streams reset before their answer at once, 33 more a second. An
    # attacker that reconnects each time gets the same: its calls never reach the model, and
    # the bystander is served all along.
    executed_before = inference_count(server)
    before = rss_mib(server)
    goaways: list[int | None] = []
    with Bystander(server) as bystander, HealthProbe(server):
        for _ in range(6):
            attacker = RawHttp2(server)
            try:
                attacker.open()
                with suppress(OSError):  # the server closes midway
                    attacker.send(rapid_resets(attacker, 3000))
                goaways.append(attacker.goaway_code())
            finally:
                attacker.close()
        answered_during_the_attack = bystander.answered
    assert goaways == [ENHANCE_YOUR_CALM] * 6
    assert answered_during_the_attack > 0
    # Calls reset before their handler ran never reach the model (a few may, in a later turn).
    assert inference_count(server) - executed_before - answered_during_the_attack < 6 * 1000 // 20
    assert rss_mib(server) - before < 50


def test_streams_refused_past_max_concurrent_streams_spend_the_same_budget(server: ServerProcess) -> None:
    # 1,024 streams held open (their handlers wait for a message), then 1,100 more: each is
    # REFUSED_STREAM, and past 1,000 refusals the connection gets GOAWAY ENHANCE_YOUR_CALM.
    raw = RawHttp2(server)
    try:
        raw.open()
        block = raw.headers_block("ModelStreamInfer")
        opened = b"".join(frame(HEADERS, END_HEADERS, 2 * i + 1, block) for i in range(1024))
        refused = b"".join(frame(HEADERS, END_HEADERS, 2 * i + 1, block) for i in range(1024, 2124))
        raw.send(opened)
        with suppress(OSError):
            raw.send(refused)
        codes = []
        goaway = None
        for kind, _flags, _sid, payload in raw.frames(20):
            if kind == RST_STREAM:
                codes.append(int.from_bytes(payload, "big"))
            elif kind == GOAWAY:
                goaway = int.from_bytes(payload[4:8], "big")
    finally:
        raw.close()
    assert goaway == ENHANCE_YOUR_CALM
    assert 900 <= codes.count(REFUSED_STREAM) <= 1100, len(codes)


# Floods of frames that carry nothing ---------------------------------------------------------


def test_a_continuation_flood_ends_at_the_ninth_frame(raw: RawHttp2) -> None:
    raw.open()
    block = raw.headers_block("ServerLive")
    raw.send(frame(HEADERS, 0, 1, block[:4]))
    with suppress(OSError):
        raw.send(frame(CONTINUATION, 0, 1, b"") * 100_000)
    assert raw.goaway_code() == ENHANCE_YOUR_CALM


@pytest.mark.parametrize(
    "flood",
    [frame(DATA, 0, 1, b""), frame(PRIORITY, 0, 3, b"\x00\x00\x00\x01\x10"), frame(0xFA, 0, 0, b"x")],
    ids=["empty-data", "priority", "unknown-frames"],
)
def test_floods_of_frames_that_carry_nothing_get_goaway_enhance_your_calm(
    server: ServerProcess, raw: RawHttp2, flood: bytes
) -> None:
    raw.open()
    raw.send(frame(HEADERS, END_HEADERS, 1, raw.headers_block("ModelStreamInfer")))
    with Bystander(server), suppress(OSError):
        raw.send(flood * 12_000)  # nghttp2's budget: 10,000 at once, 330 a second
    assert raw.goaway_code() == ENHANCE_YOUR_CALM


# Floods of frames that make the server write -------------------------------------------------


@pytest.mark.parametrize("kind", [PING, SETTINGS], ids=["pings", "settings"])
def test_a_client_that_does_not_read_its_acks_is_cut_off(
    server: ServerProcess, raw: RawHttp2, kind: int
) -> None:
    # Frames that each ask for an ACK, from a client that reads nothing (with a call open, so
    # that the PING policy does not end it first). Once its socket holds all it can, the ACKs
    # queue in the server, and past 1000 of them (nghttp2's max_outbound_ack; Go's server:
    # 10000 control frames) the server ends the connection with GOAWAY ENHANCE_YOUR_CALM,
    # before it stops reading; its memory does not grow by what the client sends.
    raw.open()
    raw.send(frame(HEADERS, END_HEADERS, 1, raw.headers_block("ModelStreamInfer")))  # a call open
    raw.sock.settimeout(10.0)
    flood = frame(kind, 0, 0, b"12345678" if kind == PING else b"")
    before = rss_mib(server)
    sent = 0
    burst = flood * 10_000
    with Bystander(server), HealthProbe(server), pytest.raises((ConnectionResetError, BrokenPipeError)):
        while sent < 10_000_000 * len(flood):
            raw.sock.sendall(burst)
            sent += len(burst)
    assert rss_mib(server) - before < 20
    assert "closed: over 1000 answers queued for a client that does not read" in server.log


def read_until_ping_ack(raw: RawHttp2, payload: bytes) -> None:
    """Reads the server's frames until it acknowledges the PING that carries `payload`."""
    for kind, flags, _sid, data in raw.frames(60.0):
        if kind == PING and flags & ACK and data == payload:
            return


def test_initial_window_changes_cost_nothing_per_open_stream(server: ServerProcess) -> None:
    # 20,000 SETTINGS_INITIAL_WINDOW_SIZE changes, with 1,000 streams open and with none: the
    # server's CPU for them must not grow with the streams (it did: per stream per change).
    def flood_cpu(open_streams: int) -> float:
        raw = RawHttp2(server)
        try:
            raw.open()
            block = raw.headers_block("ModelStreamInfer")
            raw.send(b"".join(frame(HEADERS, END_HEADERS, 2 * i + 1, block) for i in range(open_streams)))
            changes = b"".join(
                frame(SETTINGS, 0, 0, setting(INITIAL_WINDOW_SIZE, 65535 + i % 2)) for i in range(20_000)
            )
            reader = threading.Thread(target=read_until_ping_ack, args=(raw, b"lastping"), daemon=True)
            reader.start()
            start = cpu_seconds(server)
            raw.send(changes + frame(PING, 0, 0, b"lastping"))
            reader.join(60)
            return cpu_seconds(server) - start
        finally:
            raw.close()

    alone, with_streams = flood_cpu(0), flood_cpu(1000)
    assert with_streams < 2 * alone + 0.5, (alone, with_streams)


# Compressed messages -------------------------------------------------------------------------


def compressed_call(raw: RawHttp2, stream_id: int, payload: bytes, encoding: str) -> dict[str, str]:
    block = raw.headers_block("ModelInfer", ("grpc-encoding", encoding))
    raw.send(
        frame(HEADERS, END_HEADERS, stream_id, block)
        + frame(DATA, END_STREAM, stream_id, message(payload, compressed=True))
    )
    kind, fields = raw.outcome(stream_id, seconds=30)
    assert kind == "answer", (kind, fields)
    return fields  # type: ignore[return-value]


def test_a_gzip_bomb_is_resource_exhausted_without_holding_up_the_others(
    server: ServerProcess, raw: RawHttp2
) -> None:
    # 300 KB of gzip that inflates to 300 MiB, past the 256 MiB message limit; the inflating
    # happens off the event loop, so the bystander and the health probe are answered meanwhile.
    bomb = gzip.compress(b"\0" * (300 * 1024 * 1024), 9)
    raw.open()
    with Bystander(server) as bystander, HealthProbe(server):
        before = bystander.answered
        for stream_id in (1, 3):
            fields = compressed_call(raw, stream_id, bomb, "gzip")
            assert fields["grpc-status"] == RESOURCE_EXHAUSTED, fields
            assert "larger than max" in fields["grpc-message"]
        assert bystander.answered > before


@pytest.mark.parametrize(
    ("payload", "encoding"),
    [
        (gzip.compress(infer_request(64))[:-8], "gzip"),  # no CRC and length trailer
        (gzip.compress(infer_request(64)) + b"garbage", "gzip"),
        (zlib.compress(infer_request(64))[:-6], "deflate"),
        (b"not compressed at all", "gzip"),
    ],
    ids=["truncated-gzip", "gzip-and-garbage", "truncated-deflate", "not-gzip"],
)
def test_broken_compressed_messages_are_internal(raw: RawHttp2, payload: bytes, encoding: str) -> None:
    raw.open()
    fields = compressed_call(raw, 1, payload, encoding)
    assert fields["grpc-status"] == INTERNAL, fields
    assert "does not decompress" in fields["grpc-message"]
    good = compressed_call(raw, 3, gzip.compress(infer_request(64)), "gzip")
    assert good["grpc-status"] == "0", good
