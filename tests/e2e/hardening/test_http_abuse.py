"""The HTTP server under attack, over raw sockets: slow clients, oversized and malformed requests,
smuggling, decompression bombs, pipelining floods, connection floods.

Each attack checks its answer, that `/v2/health/ready` on another connection keeps answering
(a probe thread asks it, and each probe must be answered), and that the server logs no traceback for a client's mistake.
The limits and timeouts are set small so that the module runs in seconds. A timeout's test
asserts what the client sees when it runs out (the status and the error naming the timeout, the
server's close) and that nothing came before it, never how long it took.
"""

from __future__ import annotations

import gzip
import json
import re
import resource
import socket
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

from coreserve.testing import ServerProcess
from support.waiting import wait_until
from support.wire.health_probe import HealthProbe

TIMEOUT = 1.0  # every --http-*-timeout-secs of the servers below
MAX_BODY = 1 << 20
MAX_URL = 4096
MAX_HEADERS = 50
MAX_HEADER_BYTES = 8192
MAX_PIPELINED = 8
HEADERS_TOO_LARGE = f"request header fields too large: the limit is {MAX_HEADER_BYTES} bytes"
LIMIT_FLAGS = [
    f"--http-header-timeout-secs={TIMEOUT}",
    f"--http-body-timeout-secs={TIMEOUT}",
    f"--http-keepalive-timeout-secs={TIMEOUT}",
    f"--http-write-timeout-secs={TIMEOUT}",
    f"--http-max-input-size={MAX_BODY}",
    f"--http-max-url-size={MAX_URL}",
    f"--http-max-header-count={MAX_HEADERS}",
    f"--http-max-header-size={MAX_HEADER_BYTES}",
    f"--http-max-pipelined={MAX_PIPELINED}",
]
# How long a client waits for what a timeout of the server brings before the test fails: a
# deadline for the test, many timeouts long, as the machine is shared and slow.
DEADLINE_S = 10.0
# A log line at ERROR or CRITICAL level ("<time> E coreserve...] ...").
_ERROR_LINE = re.compile(r"^\S+ \S+ [EC] \S+\] ", re.MULTILINE)


def _server(repository: Path, *flags: str) -> ServerProcess:
    return ServerProcess([repository], [*flags, "--allow-grpc=false", "--allow-metrics=false"]).start()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = _server(tmp_path_factory.mktemp("abuse"), *LIMIT_FLAGS)
    yield process
    process.close()


@pytest.fixture(autouse=True)
def _no_traceback_in_the_log(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "server" in request.fixturenames:
        _assert_quiet_log(request.getfixturevalue("server"))


def _assert_quiet_log(server: ServerProcess) -> None:
    log = server.log
    assert "Traceback" not in log, log
    assert not _ERROR_LINE.search(log), log


class Raw:
    """A client connection that sends bytes as they are and reads whole responses."""

    def __init__(self, server: ServerProcess, timeout: float = DEADLINE_S) -> None:
        host, port = server.http_url.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> bool:
        try:
            chunk = self.sock.recv(1 << 20)
        except ConnectionResetError:
            chunk = b""
        self.buffer += chunk
        return bool(chunk)

    def response(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buffer:
            if not self._fill():
                raise ConnectionError(f"closed before a whole response: {self.buffer!r}")
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        size = int(headers.get("content-length", "0"))
        while len(self.buffer) < size:
            if not self._fill():
                raise ConnectionError("closed inside a response body")
        body, self.buffer = self.buffer[:size], self.buffer[size:]
        return int(lines[0].split()[1]), headers, body

    def closed_by_server(self) -> bool:
        """True once the server closed the connection (waits up to the socket's timeout)."""
        return not self.buffer and not self._fill()

    def nothing_yet(self) -> bool:
        """Whether the connection is open with nothing received, looking without waiting."""
        self.sock.setblocking(False)
        try:
            chunk = self.sock.recv(1 << 16)
        except BlockingIOError:
            return not self.buffer
        finally:
            self.sock.setblocking(True)
            self.sock.settimeout(DEADLINE_S)
        self.buffer += chunk
        return False

    def close(self) -> None:
        self.sock.close()


@contextmanager
def raw(server: ServerProcess, timeout: float = DEADLINE_S) -> Iterator[Raw]:
    connection = Raw(server, timeout)
    try:
        yield connection
    finally:
        connection.close()


def _error(body: bytes) -> str:
    return str(json.loads(body)["error"])


def _rss_kib(server: ServerProcess) -> int:
    assert server.process is not None
    status = Path(f"/proc/{server.process.pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]


def _send_in_background(connection: Raw, data: bytes) -> threading.Thread:
    """Sends `data` from a thread; the server may stop reading and close midway."""

    def send() -> None:
        with suppress(OSError):
            connection.send(data)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


# Slow clients


def test_slowloris_headers_trickled_get_408_at_the_header_timeout(server: ServerProcess) -> None:
    # A test of the timeout itself. The header timeout bounds the whole header block: the
    # client is cut off while it is still trickling lines (a timer that each line restarted
    # would let it trickle to the end), by the server (its 408 naming the timeout, then its
    # close), and not at once (the request line is not answered).
    lines = int(4 * TIMEOUT / 0.1)  # one header line every 100 ms, for 4 timeouts
    sent = 0
    with HealthProbe(server), raw(server) as connection:
        connection.send(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n")
        assert connection.nothing_yet()
        with suppress(OSError):  # the server may close while a line is on its way
            while sent < lines and b"\r\n\r\n" not in connection.buffer and _readable_or_open(connection):
                connection.send(b"X-Trickle-%d: y\r\n" % sent)
                sent += 1
                time.sleep(0.1)  # the slow client's pace: the attack itself
        status, headers, body = connection.response()
        assert status == 408
        assert headers["connection"] == "close"
        assert "headers not received within 1s" in _error(body)
        assert connection.closed_by_server()
    assert sent < lines, f"the client trickled all {lines} header lines and was not cut off"


def _readable_or_open(connection: Raw) -> bool:
    """Takes what the server sent so far without waiting; False if it closed."""
    connection.sock.setblocking(False)
    try:
        chunk = connection.sock.recv(1 << 16)
    except BlockingIOError:
        return True
    except ConnectionResetError:
        return False
    finally:
        connection.sock.setblocking(True)
        connection.sock.settimeout(DEADLINE_S)
    connection.buffer += chunk
    return bool(chunk)


def test_many_slowloris_connections_do_not_slow_health_probes(server: ServerProcess) -> None:
    with HealthProbe(server):
        connections = [Raw(server) for _ in range(40)]
        try:
            for connection in connections:
                connection.send(b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            statuses = [connection.response()[0] for connection in connections]
        finally:
            for connection in connections:
                connection.close()
    assert statuses == [408] * len(connections)


def _health_ready(server: ServerProcess, timeout: float = DEADLINE_S) -> int:
    """The status of /v2/health/ready on a connection of its own."""
    with raw(server, timeout) as other:
        other.send(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
        return other.response()[0]


def test_half_sent_body_gets_408_at_the_body_timeout(server: ServerProcess) -> None:
    # A test of the timeout itself: the 408 naming the body timeout comes from the server, as
    # does the close, and not at once (the half body is not answered).
    with HealthProbe(server), raw(server) as connection:
        connection.send(b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
        assert connection.nothing_yet()
        assert _health_ready(server) == 200  # served while the body is awaited
        status, _, body = connection.response()
        assert status == 408
        assert "request body: nothing received for 1s" in _error(body)
        assert connection.closed_by_server()


def test_idle_keep_alive_connection_is_closed_after_the_keepalive_timeout(server: ServerProcess) -> None:
    # A test of the timeout itself. Each request starts the idle time anew: three pauses of
    # 0.4 timeouts, more than a timeout in all, leave the connection open; after the last
    # answer, which does not close it, the server closes it once idle (EOF, nothing said),
    # before the client's own deadline.
    live = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
    with raw(server) as connection:
        for _ in range(3):
            connection.send(live)
            assert connection.response()[0] == 200
            time.sleep(0.4 * TIMEOUT)  # the client idles: the behaviour under test
        connection.send(live)  # still open
        status, headers, _ = connection.response()
        assert (status, headers.get("connection")) == (200, None)
        assert connection.nothing_yet()
        assert connection.closed_by_server()


def test_a_connection_that_sends_nothing_is_closed_silently(server: ServerProcess) -> None:
    # A test of the timeout itself: the server closes the silent connection without a word
    # (EOF, no bytes), not at once and before the client's own deadline, and serves others
    # meanwhile.
    with raw(server) as silent:
        assert silent.nothing_yet()
        assert _health_ready(server) == 200  # served while the silent connection is open
        assert silent.closed_by_server()


def test_a_client_that_reads_no_answer_is_dropped_after_the_write_timeout(server: ServerProcess) -> None:
    count = 20_000  # 60 MB of requests, as much of answers: more than the sockets' buffers hold
    with HealthProbe(server), raw(server) as connection:
        request = b"GET /v2/models/%s HTTP/1.1\r\nHost: x\r\n\r\n" % (b"m" * 3000)  # a 404 naming it
        sender = _send_in_background(connection, request * count)  # the answers are not read
        sender.join(4 * TIMEOUT + DEADLINE_S)
        assert not sender.is_alive(), "the server neither answered nor dropped the client"
        while connection._fill():  # what reached the client before it was dropped
            pass
        assert connection.buffer.count(b"HTTP/1.1 404") < count  # dropped, not answered in full
    with raw(server) as connection:  # the server is fine
        connection.send(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
        assert connection.response()[0] == 200


# Oversized requests


def test_long_url_gets_414_without_being_echoed(server: ServerProcess) -> None:
    with HealthProbe(server), raw(server) as connection:
        path = b"/v2/" + b"a" * (10 << 20)
        _send_in_background(connection, b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, body = connection.response()
        assert status == 414
        assert headers["content-type"] == "application/json"
        assert _error(body) == f"URI too long: the limit is {MAX_URL} bytes"
        assert connection.closed_by_server()


def test_url_under_the_limit_on_an_unknown_path_is_quoted_cut_short(server: ServerProcess) -> None:
    with raw(server) as connection:
        path = "/v2/" + "b" * (MAX_URL - 100)
        connection.send(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        status, _, body = connection.response()
    assert status == 404
    message = _error(body)
    assert message.startswith("unknown endpoint: GET /v2/bbbb")
    assert len(message) < 300
    assert f"({len(path)} characters)" in message


def test_too_many_headers_get_431(server: ServerProcess) -> None:
    with raw(server) as connection:
        headers = b"".join(b"X-H%d: v\r\n" % number for number in range(MAX_HEADERS))  # + Host
        connection.send(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
        status, _, body = connection.response()
    assert status == 431
    assert _error(body) == f"too many header fields: the limit is {MAX_HEADERS}"


def test_headers_at_the_limits_are_served(server: ServerProcess) -> None:
    with raw(server) as connection:
        value = b"v" * (MAX_HEADER_BYTES // (MAX_HEADERS - 1) - 8)
        headers = b"".join(b"X-H%02d: %b\r\n" % (number, value) for number in range(MAX_HEADERS - 1))
        connection.send(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
        assert connection.response()[0] == 200


def test_huge_headers_get_431_before_they_are_all_sent(server: ServerProcess) -> None:
    rss_before = _rss_kib(server)
    attack = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Big: " + b"v" * (30 << 20)
    with HealthProbe(server):
        connections = [Raw(server) for _ in range(10)]
        try:
            senders = [_send_in_background(connection, attack) for connection in connections]
            for connection in connections:
                status, _, body = connection.response()
                assert status == 431
                assert _error(body) == HEADERS_TOO_LARGE
                assert connection.closed_by_server()
            for sender in senders:
                sender.join(10)
        finally:
            for connection in connections:
                connection.close()
    assert _rss_kib(server) - rss_before < 50 * 1024  # none of the 300 MB was kept


@pytest.mark.parametrize(
    "framing",
    [b"2\r\n{}\r\n0\r\nX-Trailer: ", b"2;ext="],
    ids=["trailer", "chunk-extension"],
)
def test_huge_trailer_or_chunk_framing_gets_431(server: ServerProcess, framing: bytes) -> None:
    rss_before = _rss_kib(server)
    with HealthProbe(server), raw(server) as connection:
        head = b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        sender = _send_in_background(connection, head + framing + b"v" * (40 << 20))
        status, _, body = connection.response()
        assert status == 431
        assert _error(body) == "request body framing or trailer fields too large"
        assert connection.closed_by_server()
        sender.join(10)
    assert _rss_kib(server) - rss_before < 20 * 1024


def test_chunked_body_with_small_trailer_and_extensions_is_served(server: ServerProcess) -> None:
    with raw(server) as connection:
        connection.send(
            b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"1;name=value\r\n{\r\n1\r\n}\r\n0\r\nX-Checksum: abc\r\n\r\n"
        )
        status, _, body = connection.response()
    assert (status, json.loads(body)) == (200, [])


def test_100k_repeated_headers_get_431_before_the_header_block_ends(server: ServerProcess) -> None:
    # Refused at the first field past the limit (a field is whole once the next line starts,
    # hence one line more): the answer comes while the header block is still unfinished, so
    # nothing of the flood that follows is read, let alone joined.
    line = b"X-Repeated: value\r\n"
    with HealthProbe(server), raw(server) as connection:
        connection.send(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n" + line * (MAX_HEADERS + 1))
        status, _, body = connection.response()  # no blank line has been sent
        assert status == 431
        assert _error(body) == f"too many header fields: the limit is {MAX_HEADERS}"
        _send_in_background(connection, line * 100_000 + b"\r\n")  # the rest of the flood
        assert connection.closed_by_server()


def test_repeated_headers_under_the_limit_are_joined(server: ServerProcess) -> None:
    with raw(server) as connection:
        connection.send(
            b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nX-A: 1\r\nX-A: 2\r\n"
            b"Content-Length: 2\r\n\r\n{}"
        )
        assert connection.response()[0] == 200


def test_expect_100_continue_over_the_limit_gets_413_at_once(server: ServerProcess) -> None:
    # At once: the first answer is the 413, refused on the head alone (no "100 Continue"
    # invites the body, which is never sent); a server that waited for the body would answer
    # 408 at the body timeout instead.
    with raw(server) as connection:
        connection.send(
            b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n"
            b"Expect: 100-continue\r\n\r\n"
        )
        status, headers, body = connection.response()
        assert status == 413
        assert headers["connection"] == "close"
        assert _error(body) == f"request body too large: the limit is {MAX_BODY} bytes"
        assert connection.closed_by_server()


def test_expect_100_continue_under_the_limit_gets_100(server: ServerProcess) -> None:
    with raw(server) as connection:
        connection.send(
            b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
            b"Expect: 100-continue\r\n\r\n"
        )
        assert connection.response()[0] == 100
        connection.send(b"{}")
        assert connection.response()[0] == 200


# Compressed bodies


def _post_encoded(server: ServerProcess, body: bytes, encoding: str) -> tuple[int, bytes]:
    with raw(server) as connection:
        connection.send(
            b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Encoding: %b\r\n"
            b"Content-Length: %d\r\n\r\n%b" % (encoding.encode(), len(body), body)
        )
        status, _, reply = connection.response()
    return status, reply


def _raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


@pytest.mark.parametrize(
    ("encoding", "body", "reason"),
    [
        ("gzip", gzip.compress(b'{"ready": true}')[:-8], "the gzip stream is truncated"),
        ("gzip", gzip.compress(b'{"ready": true}')[:-3], "the gzip stream is truncated"),
        ("gzip", gzip.compress(b'{"ready": true}') + b"garbage", "7 bytes of trailing data after the gzip"),
        ("deflate", zlib.compress(b'{"ready": true}')[:-4], "the deflate stream is truncated"),
        ("deflate", zlib.compress(b'{"ready": true}') + b"\0", "1 bytes of trailing data after the deflate"),
        ("deflate", _raw_deflate(b'{"ready": true}') + b"xy", "2 bytes of trailing data after the deflate"),
    ],
    ids=[
        "gzip-no-trailer",
        "gzip-cut-trailer",
        "gzip-garbage",
        "zlib-no-trailer",
        "zlib-garbage",
        "raw-garbage",
    ],
)
def test_truncated_or_padded_compressed_bodies_get_400(
    server: ServerProcess, encoding: str, body: bytes, reason: str
) -> None:
    status, reply = _post_encoded(server, body, encoding)
    assert status == 400
    assert reason in _error(reply)


@pytest.mark.parametrize(
    ("encoding", "body"),
    [
        ("gzip", gzip.compress(b'{"ready": true}')),
        ("gzip", gzip.compress(b'{"ready": ') + gzip.compress(b"true}")),  # two gzip members
        ("deflate", zlib.compress(b'{"ready": true}')),
        ("deflate", _raw_deflate(b'{"ready": true}')),
    ],
    ids=["gzip", "gzip-two-members", "zlib", "raw-deflate"],
)
def test_whole_compressed_bodies_are_read(server: ServerProcess, encoding: str, body: bytes) -> None:
    status, reply = _post_encoded(server, body, encoding)
    assert (status, json.loads(reply)) == (200, [])


def test_gzip_bomb_gets_413(server: ServerProcess) -> None:
    bomb = gzip.compress(b" " * (200 * MAX_BODY), 9)  # 200 MiB of spaces in about 200 KB
    assert len(bomb) < MAX_BODY
    with HealthProbe(server):
        status, reply = _post_encoded(server, bomb, "gzip")
    assert status == 413
    assert "too large once decompressed" in _error(reply)


# Smuggling and malformed framing


@pytest.mark.parametrize(
    "head",
    [
        b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
        b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
        b"Content-Length: 5\r\nContent-Length: 6\r\n",
        b"Content-Length: 5\r\nContent-Length: 5\r\n",
        b"Content-Length: 5, 6\r\n",
        b"Content-Length: -5\r\n",
        b"Transfer-Encoding: chunked, identity\r\n",
        b"Transfer-Encoding : chunked\r\n",
    ],
    ids=["cl-te", "te-cl", "two-cl", "same-cl-twice", "cl-list", "cl-negative", "te-not-last", "te-space"],
)
def test_smuggling_attempts_get_400_and_close(server: ServerProcess, head: bytes) -> None:
    with raw(server) as connection:
        connection.send(
            b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\n" + head + b"\r\n0\r\n\r\n"
            b"GET /v2/health/smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        status, headers, body = connection.response()
        assert status == 400
        assert headers["connection"] == "close"
        assert _error(body).startswith("malformed HTTP request")
        assert connection.closed_by_server()  # the smuggled request is never answered


# Floods


def test_pipelining_flood_is_answered_in_order_with_flat_memory(server: ServerProcess) -> None:
    count = 5000
    # Metadata of unknown models: each 404 names its model (readiness is a bare 400 as in Triton).
    requests = b"".join(b"GET /v2/models/m%d HTTP/1.1\r\nHost: x\r\n\r\n" % n for n in range(count))
    rss_before = _rss_kib(server)
    with HealthProbe(server), raw(server) as connection:
        sender = _send_in_background(connection, requests)
        for number in range(count):
            status, _, body = connection.response()
            assert status == 404
            assert f"'m{number}'" in _error(body)
        sender.join(10)
    assert _rss_kib(server) - rss_before < 50 * 1024


def test_connection_limit_refuses_politely_and_service_resumes(tmp_path: Path) -> None:
    server = _server(tmp_path, *LIMIT_FLAGS, "--http-max-connections=50")
    try:
        host, port = server.http_url.rsplit(":", 1)
        # No pause for the server to take them: it accepts in the order of connection, so the
        # 51st finds the 50 idle ones held, as its 503 shows.
        idle = [socket.create_connection((host, int(port)), timeout=10) for _ in range(50)]
        with raw(server) as refused:
            refused.send(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
            status, headers, body = refused.response()
            assert status == 503
            assert headers["connection"] == "close"
            assert _error(body) == "too many connections: the limit is 50"
            assert refused.closed_by_server()
        extra = [socket.create_connection((host, int(port)), timeout=10) for _ in range(150)]
        assert all(sock.recv(1 << 16).startswith(b"HTTP/1.1 503") for sock in extra)
        for sock in extra:
            sock.close()
        # The idle ones are closed after the header timeout; then service resumes.
        assert all(sock.recv(1) == b"" for sock in idle)
        for sock in idle:
            sock.close()
        with HealthProbe(server) as probe:
            probe.wait_for_answers(5)  # service resumed
        log = server.log
        assert log.count("over the limit of 50 (--http-max-connections)") == 1, log
        _assert_quiet_log(server)
    finally:
        server.close()


def test_connections_past_the_file_limit_do_not_stop_the_server(tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))  # the server inherits it
    try:
        server = _server(tmp_path, *LIMIT_FLAGS, "--http-max-connections=10000")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        assert "above 3/4 of the open-file limit" in server.log
        host, port = server.http_url.rsplit(":", 1)
        clients = []
        for _ in range(1000):
            with suppress(OSError):
                clients.append(socket.create_connection((host, int(port)), timeout=5))
        assert len(clients) > 256  # more than the server has descriptors for
        # Every one is closed without an answer: those the server has no descriptor for at
        # once (the event loop accepts and closes them), the others at their header timeout.
        try:
            unanswered = sum(_closed_unanswered(sock) for sock in clients)
            assert unanswered == len(clients), f"{len(clients) - unanswered} clients got an answer"
        finally:
            for sock in clients:
                sock.close()
        # The server recovers once the descriptors are back.
        wait_until(lambda: _answers_health(server), "the server answers again", 10 * TIMEOUT, 0.1)
        with HealthProbe(server) as probe:
            probe.wait_for_answers(5)  # service resumed
        log = server.log
        assert "connections open, near the open-file limit" in log, log
        assert log.count("near the open-file limit") == 1, log  # one line per 10 s at most
        assert "Traceback" not in log, log
    finally:
        server.close()


def _closed_unanswered(sock: socket.socket) -> bool:
    """Waits until the server closes `sock`; True if it said nothing first."""
    sock.settimeout(30)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def _answers_health(server: ServerProcess) -> bool:
    with suppress(OSError):
        return _health_ready(server, timeout=2) == 200
    return False


def test_default_connection_limit_keeps_under_the_file_limit(tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))  # the server inherits it
    try:
        server = _server(tmp_path, *LIMIT_FLAGS)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        host, port = server.http_url.rsplit(":", 1)
        clients = [socket.create_connection((host, int(port)), timeout=10) for _ in range(250)]
        try:
            refused = 0
            for sock in clients[-50:]:  # 3/4 of 256 are served: the last ones are refused politely
                answer = sock.recv(1 << 16)
                assert answer.startswith(b"HTTP/1.1 503") and b"the limit is 192" in answer
                refused += 1
        finally:
            for sock in clients:
                sock.close()
        assert refused == 50
        with HealthProbe(server) as probe:
            probe.wait_for_answers(5)  # service resumed
        log = server.log
        assert "over the limit of 192" in log, log
        assert "open-file limit" not in log, log  # the system never had to reset anyone
        _assert_quiet_log(server)
    finally:
        server.close()
