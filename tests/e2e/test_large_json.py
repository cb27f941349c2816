"""Large JSON bodies (tens of megabytes) on a real server: parsed in a worker process, so that
other connections keep getting answers; the errors of the in-loop decoder; a client that
leaves while its body is parsed stops the parsing.

Exact latencies are benchmarks/large_json.py's to measure; the bounds here are generous.
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import orjson
import pytest

from coreserve.config import parse_config
from coreserve.config.signature import ModelSignature
from coreserve.errors import CoreserveError
from coreserve.protocol.generate import decode_generate_request
from coreserve.protocol.http_body import decode_infer_request
from coreserve.testing import ServerProcess
from http_raw import error_of, request
from model_builders import identity_model, write_model

IDENTITY = """
backend: "onnxruntime"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
INFER = "/v2/models/identity/infer"
GENERATE = "/v2/models/identity/generate"
SMALL = orjson.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [3], "data": [1, 2, 3]}]})
# About 60 MB of JSON: six-digit values, about nine bytes each.
VALUES = np.round(np.random.default_rng(17).random(6_600_000), 6)
pytestmark = pytest.mark.usefixtures("no_traceback")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("large-json")
    write_model(repository, "identity", identity_model("FP32", ["n"]), IDENTITY)
    server = ServerProcess([repository], ["--model-control-mode=explicit", "--load-model=identity"]).start()
    yield server
    server.close()


def _infer_body(values: object, shape: object = None, datatype: str = "FP32", request_id: str = "") -> bytes:
    count = len(values) if isinstance(values, list) else 0
    tensor = {
        "name": "INPUT0",
        "datatype": datatype,
        "shape": [count] if shape is None else shape,
        "data": values,
    }
    return orjson.dumps({"id": request_id, "inputs": [tensor]})


def _worker_pids(server: ServerProcess) -> set[int]:
    """The server's JSON worker processes that are alive (not zombies)."""
    assert server.process is not None
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rpartition(")")[2].split()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[1]) == server.process.pid and stat[0] != "Z" and b"coreserve.json_worker" in command:
            found.add(int(entry.name))
    return found


def _cpu_ticks(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return int(stat[11]) + int(stat[12])


class Probes:
    """Health on a new connection and a small infer on a keep-alive one, in turn, until stopped."""

    def __init__(self, server: ServerProcess) -> None:
        self.host, port = server.http_url.rsplit(":", 1)
        self.port = int(port)
        self.health: list[float] = []
        self.small: list[float] = []
        self.failures: list[str] = []

    def run_until(self, done: threading.Event) -> None:
        keep_alive = http.client.HTTPConnection(self.host, self.port, timeout=60)
        try:
            while not done.is_set():
                started = time.perf_counter()
                connection = http.client.HTTPConnection(self.host, self.port, timeout=60)
                connection.request("GET", "/v2/health/ready")
                status = connection.getresponse().status
                connection.close()
                self.health.append(time.perf_counter() - started)
                if status != 200:
                    self.failures.append(f"health: {status}")
                started = time.perf_counter()
                keep_alive.request("POST", INFER, SMALL)
                answer = keep_alive.getresponse()
                reply = answer.read()
                self.small.append(time.perf_counter() - started)
                if answer.status != 200 or orjson.loads(reply)["outputs"][0]["data"] != [1, 2, 3]:
                    self.failures.append(f"small infer: {answer.status} {reply[:200]!r}")
                time.sleep(0.01)
        finally:
            keep_alive.close()


def test_other_connections_are_answered_while_a_60_mb_json_request_is_decoded(server: ServerProcess) -> None:
    body = _infer_body(VALUES.tolist())
    assert len(body) > 55_000_000
    answers: list[tuple[int, bytes, float]] = []
    done = threading.Event()

    def large_request() -> None:
        try:
            started = time.perf_counter()
            status, _, reply = request(server.http_url, "POST", INFER, body)
            answers.append((status, reply, time.perf_counter() - started))
        finally:
            done.set()

    for attempt in range(2):  # the first also starts the worker process
        probes = Probes(server)
        thread = threading.Thread(target=large_request)
        thread.start()
        probes.run_until(done)
        thread.join()
        done.clear()
        status, reply, took = answers[attempt]
        assert status == 200, reply[:300]
        output = orjson.loads(reply)["outputs"][0]
        assert output["shape"] == [VALUES.size]
        assert np.array_equal(np.array(output["data"], np.float32), VALUES.astype(np.float32))
        assert not probes.failures, probes.failures[:5]
        # On the loop (or a thread) the decoding held every probe for one long stretch of the
        # request; here they keep coming through, each in a small part of it.
        assert len(probes.health) >= 5 and len(probes.small) >= 5, (len(probes.health), took)
        worst = max(probes.health + probes.small)
        assert worst < 0.25 * took and worst < 1.5, (
            f"a probe waited {worst:.2f}s during a {took:.2f}s request"
        )


def _generate_signature() -> ModelSignature:
    return ModelSignature(parse_config(f'name: "identity" {IDENTITY}'))


def _expected_error(decode: Callable[[], object]) -> str:
    """The message of the error that the server's in-loop decoder raises for a body."""
    try:
        decode()
    except CoreserveError as exc:
        return exc.message
    raise AssertionError("the body decodes")


LARGE = VALUES[:200_000].tolist()  # over a megabyte of JSON: decoded in the worker process
BAD_LARGE_BODIES = {
    "malformed JSON": _infer_body(LARGE)[:-2],
    "a shape of more elements than the data": _infer_body(LARGE, shape=[len(LARGE) + 1]),
    "a shape of fewer elements than the data": _infer_body(LARGE, shape=[10, 10]),
    "an unknown datatype": _infer_body(LARGE, datatype="FP33"),
    "strings for FP32": _infer_body([str(value) for value in LARGE]),
    "numbers with fractions for INT32": _infer_body(LARGE, datatype="INT32"),
    "a value out of INT8's range": _infer_body([1] * 600_000 + [300], datatype="INT8"),
    "ragged data": _infer_body([LARGE, [1.0]], shape=[2, len(LARGE)]),
    "a repeated input": orjson.dumps(
        {"id": "twice", "inputs": [orjson.loads(_infer_body(LARGE))["inputs"][0]] * 2}
    ),
}


@pytest.mark.parametrize("body", BAD_LARGE_BODIES.values(), ids=BAD_LARGE_BODIES.keys())
def test_a_bad_large_json_body_gets_the_error_of_the_in_loop_decoder(
    server: ServerProcess, body: bytes
) -> None:
    assert len(body) > 1 << 20
    expected = _expected_error(lambda: decode_infer_request(body, None, "identity", ""))
    assert error_of(server.http_url, INFER, body) == (400, expected)


def test_a_large_generate_body_is_decoded_too(server: ServerProcess) -> None:
    status, _, reply = request(server.http_url, "POST", GENERATE, orjson.dumps({"INPUT0": LARGE}))
    assert status == 200, reply[:300]
    assert np.array_equal(np.array(orjson.loads(reply)["OUTPUT0"], np.float32), np.float32(LARGE))
    bad = orjson.dumps({"INPUT0": LARGE, "stop": [1, 2]})
    expected = _expected_error(lambda: decode_generate_request(bad, _generate_signature(), "identity", ""))
    assert error_of(server.http_url, GENERATE, bad) == (400, expected)


def test_a_client_that_leaves_while_its_body_is_parsed_stops_the_parsing(server: ServerProcess) -> None:
    body = _infer_body(VALUES.tolist())
    assert request(server.http_url, "POST", INFER, _infer_body(LARGE))[0] == 200  # a worker is started
    (worker,) = _worker_pids(server)
    host, port = server.http_url.rsplit(":", 1)
    client = socket.create_connection((host, int(port)), timeout=60)
    client.sendall(f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    idle = _cpu_ticks(worker)
    deadline = time.monotonic() + 60
    while _cpu_ticks(worker) == idle and time.monotonic() < deadline:  # until the worker is at it
        time.sleep(0.005)
    client.close()
    while worker in _worker_pids(server) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert worker not in _worker_pids(server), "the worker went on parsing for a client that left"
    status, _, reply = request(server.http_url, "POST", INFER, _infer_body(LARGE))  # a new worker
    assert status == 200
    assert np.array_equal(np.array(orjson.loads(reply)["outputs"][0]["data"], np.float32), np.float32(LARGE))
    assert request(server.http_url, "POST", INFER, SMALL)[0] == 200
