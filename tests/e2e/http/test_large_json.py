"""Large JSON bodies (tens of megabytes) on a real server: parsed in a worker process, so that
other connections keep getting answers; the errors of the in-loop decoder; a client that
leaves while its body is parsed stops the parsing.

Latencies are benchmarks/transports/large_json.py's to measure; here the parsing is held outright (its
worker process stopped) while other connections are answered.
"""

from __future__ import annotations

import http.client
import socket
import threading
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
from support.model_builders import identity_model, write_model
from support.servers.json_worker_processes import cpu_ticks, stopped, worker_pids
from support.waiting import wait_until
from support.wire.http_raw import error_of, request

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


class Probes:
    """Health on a new connection and a small infer on a keep-alive one, each answered in full."""

    def __init__(self, server: ServerProcess) -> None:
        self.host, port = server.http_url.rsplit(":", 1)
        self.port = int(port)
        self.keep_alive = http.client.HTTPConnection(self.host, self.port, timeout=60)

    def answer(self, rounds: int) -> None:
        for _ in range(rounds):
            connection = http.client.HTTPConnection(self.host, self.port, timeout=60)
            try:
                connection.request("GET", "/v2/health/ready")
                assert connection.getresponse().status == 200
            finally:
                connection.close()
            self.keep_alive.request("POST", INFER, SMALL)
            answer = self.keep_alive.getresponse()
            reply = answer.read()
            assert answer.status == 200 and orjson.loads(reply)["outputs"][0]["data"] == [1, 2, 3], reply[
                :200
            ]

    def close(self) -> None:
        self.keep_alive.close()


class LargeRequest:
    """A large request on a thread of its own: `sent` once the body is all written."""

    def __init__(self, server: ServerProcess, body: bytes) -> None:
        host, port = server.http_url.rsplit(":", 1)
        self.connection = http.client.HTTPConnection(host, int(port), timeout=120)
        self.sent = threading.Event()
        self.answer: tuple[int, bytes] | None = None
        self.thread = threading.Thread(target=self._run, args=(body,))
        self.thread.start()

    def _run(self, body: bytes) -> None:
        try:
            self.connection.request("POST", INFER, body)
            self.sent.set()
            response = self.connection.getresponse()
            self.answer = (response.status, response.read())
        finally:
            self.connection.close()

    def result(self) -> tuple[int, bytes]:
        self.thread.join(timeout=120)
        assert self.answer is not None, "the large request got no answer"
        return self.answer


def _check_identity(answer: tuple[int, bytes]) -> None:
    status, reply = answer
    assert status == 200, reply[:300]
    output = orjson.loads(reply)["outputs"][0]
    assert output["shape"] == [VALUES.size]
    assert np.array_equal(np.array(output["data"], np.float32), VALUES.astype(np.float32))


def test_other_connections_are_answered_while_a_60_mb_json_request_is_decoded(server: ServerProcess) -> None:
    # The parsing is held outright: the worker process is stopped while it parses (and, the
    # second time, before it can even take the body). Other connections are answered in full
    # meanwhile, while the large request stays unanswered: nothing on the loop waits for the
    # parsing. On the loop (or a thread) no probe would be answered until the parsing ended.
    body = _infer_body(VALUES.tolist())
    assert len(body) > 55_000_000
    probes = Probes(server)
    try:
        large = LargeRequest(server, body)
        (worker,) = wait_until(lambda: worker_pids(server), "a JSON worker process takes the body")
        idle = cpu_ticks(worker)
        wait_until(lambda: cpu_ticks(worker) > idle + 5, "the worker parses the body", interval=0.005)
        with stopped(worker):
            probes.answer(5)
            assert large.answer is None and large.thread.is_alive()
        _check_identity(large.result())

        with stopped(worker):  # an idle worker: the next body cannot even be handed to it
            large = LargeRequest(server, body)
            wait_until(large.sent.is_set, "the client wrote its whole body")
            probes.answer(5)
            assert large.answer is None and large.thread.is_alive()
        _check_identity(large.result())
        assert worker_pids(server) == {worker}  # the same worker took both
        probes.answer(1)
    finally:
        probes.close()


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
    (worker,) = worker_pids(server)
    host, port = server.http_url.rsplit(":", 1)
    client = socket.create_connection((host, int(port)), timeout=60)
    client.sendall(f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    idle = cpu_ticks(worker)
    wait_until(lambda: cpu_ticks(worker) > idle, "the worker parses the body", interval=0.005)
    client.close()
    wait_until(lambda: worker not in worker_pids(server), "the worker stops parsing for a client that left")
    status, _, reply = request(server.http_url, "POST", INFER, _infer_body(LARGE))  # a new worker
    assert status == 200
    assert np.array_equal(np.array(orjson.loads(reply)["outputs"][0]["data"], np.float32), np.float32(LARGE))
    assert request(server.http_url, "POST", INFER, SMALL)[0] == 200


@pytest.mark.parametrize(
    "path",
    ["/v2/repository/index", "/v2/trace/setting", "/v2/logging", "/v2/systemsharedmemory/region/r/register"],
)
def test_a_control_body_of_millions_of_small_objects_is_refused_before_it_is_read(
    server: ServerProcess, path: str
) -> None:
    """60 MB of `{}` to an endpoint that reads its JSON on the event loop: 400, saying so, with
    the body's memory only (the objects are never made); the server serves on."""
    body = b'{"x":[' + b"{}," * 19_999_999 + b"{}]}"
    assert server.process is not None
    pid = server.process.pid
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak (VmHWM) starts again from now
    before = _status_mib(pid, "VmRSS")
    status, message = error_of(server.http_url, path, body)
    assert status == 400
    assert "too many JSON values" in message and "at most 100000" in message
    assert _status_mib(pid, "VmHWM") - before < 200
    assert request(server.http_url, "POST", INFER, SMALL)[0] == 200


def _status_mib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(field)
