"""Hardening of the data plane: client mistakes are 4xx without tracebacks, large bodies do not
stall the event loop, and a deadline that expires is counted a failure."""

from __future__ import annotations

import gzip
import json
import os
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import orjson
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

import coreserve
from coreserve.server.httpd import _answering as answering
from coreserve.server.httpd._encoding import compress
from coreserve.testing import ServerFactory, ServerProcess
from support.model_builders import identity_model, write_model
from support.servers.json_worker_processes import cpu_ticks, stopped, worker_pids
from support.waiting import requests_in, wait_until
from support.wire.http_raw import request

IDENTITY = """
backend: "onnxruntime"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
INFER = "/v2/models/identity/infer"
_HEADER_LENGTH = "Inference-Header-Content-Length"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("hardening")
    write_model(repository, "identity", identity_model("FP32", ["n"]), IDENTITY)
    server = ServerProcess([repository], ["--model-control-mode=explicit", "--load-model=identity"]).start()
    yield server
    server.close()


def _http_input(shape: object, data: object = None, **fields: object) -> bytes:
    tensor = {"name": "INPUT0", "datatype": "FP32", "shape": shape, **fields}
    if data is not None:
        tensor["data"] = data
    return json.dumps({"inputs": [tensor]}).encode()


def _grpc_request(shape: list[int], raw: bytes | None = b"") -> service_pb2.ModelInferRequest:
    message = service_pb2.ModelInferRequest(model_name="identity")
    message.inputs.add(name="INPUT0", datatype="FP32", shape=shape)
    if raw is not None:
        message.raw_input_contents.append(raw)
    return message


def _grpc_error(server: ServerProcess, message: service_pb2.ModelInferRequest) -> tuple[grpc.StatusCode, str]:
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(message, timeout=30)
    return info.value.code(), info.value.details()


def _assert_serving(server: ServerProcess) -> None:
    status, _, _ = request(server.http_url, "GET", "/v2/health/ready")
    assert status == 200
    status, _, reply = request(server.http_url, "POST", INFER, _http_input([2], [1.5, 2.5]))
    assert status == 200, reply
    assert json.loads(reply)["outputs"][0]["data"] == [1.5, 2.5]


BAD_SHAPES = {
    "65 dimensions": ([1] * 65, "has 65 dimensions; at most 64 are supported"),
    "65 zero dimensions": ([0] * 65, "has 65 dimensions; at most 64 are supported"),
    "a product past numpy's limit": ([2**40, 2**40], "has a shape too large for any tensor"),
    "an empty tensor of huge dimensions": ([0, 2**62, 2**62], "has a shape too large for any tensor"),
}


@pytest.mark.parametrize(("shape", "message"), BAD_SHAPES.values(), ids=BAD_SHAPES.keys())
def test_impossible_shapes_are_client_errors(server: ServerProcess, shape: list[int], message: str) -> None:
    for body, headers in (
        (_http_input(shape, [1.0]), {}),
        (_http_input(shape, [1.0], parameters={"binary_data_size": 4}) + b"\0" * 4, None),
    ):
        if headers is None:
            headers = {"Inference-Header-Content-Length": str(len(body) - 4)}
        status, _, reply = request(server.http_url, "POST", INFER, body, headers)
        assert status == 400, reply
        assert message in json.loads(reply)["error"]
    code, details = _grpc_error(server, _grpc_request(shape, b"\0" * 4))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert message in details
    # Without data, Triton's first check is that the input has some (its words).
    code, details = _grpc_error(server, _grpc_request(shape, None))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details == "unable to find data for input tensor 'INPUT0' for model 'identity' in request."
    _assert_serving(server)
    assert "Traceback" not in server.log


# Bodies a careless or hostile client may send to the infer endpoint; each must be a 400.
_HUGE_BINARY = _http_input([1], parameters={"binary_data_size": 2**40})
BAD_HTTP_BODIES: dict[str, tuple[bytes, dict[str, str]]] = {
    "not JSON": (b'{"inputs": [', {}),
    "a JSON list": (b"[1, 2]", {}),
    "a JSON string": (b'"inputs"', {}),
    "inputs as an object": (b'{"inputs": {"INPUT0": [1]}}', {}),
    "an input that is a number": (b'{"inputs": [7]}', {}),
    "a name that is a list": (json.dumps({"inputs": [{"name": ["x"]}]}).encode(), {}),
    "a datatype that is a number": (_http_input([1], [1.0]).replace(b'"FP32"', b"32"), {}),
    "an unknown datatype": (_http_input([1], [1.0]).replace(b'"FP32"', b'"FLOAT128"'), {}),
    "a shape of strings": (_http_input(["1"], [1.0]), {}),
    "a negative dimension": (_http_input([-1], [1.0]), {}),
    "a boolean dimension": (_http_input([True], [1.0]), {}),
    "data of objects": (_http_input([1], [{"x": 1}]), {}),
    "data of strings": (_http_input([1], ["1.0"]), {}),
    "null data": (_http_input([1], [None]), {}),
    "ragged data": (_http_input([2, 2], [[1.0, 2.0], [3.0]]), {}),
    "data that does not fill the shape": (_http_input([3], [1.0]), {}),
    "parameters as a list": (_http_input([1], [1.0], parameters=[1]), {}),
    "a nested parameter": (_http_input([1], [1.0], parameters={"a": {"b": 1}}), {}),
    "a binary size that is a string": (_http_input([1], parameters={"binary_data_size": "4"}), {}),
    "a binary size past the body": (
        _HUGE_BINARY + b"\0" * 4,
        {"Inference-Header-Content-Length": str(len(_HUGE_BINARY))},
    ),
    "a header length past the body": (_http_input([1], [1.0]), {_HEADER_LENGTH: "999999"}),
    "a header length that is not a number": (_http_input([1], [1.0]), {_HEADER_LENGTH: "x"}),
    "a negative header length": (_http_input([1], [1.0]), {_HEADER_LENGTH: "-4"}),
    "outputs as a string": (json.dumps({"inputs": [], "outputs": "OUTPUT0"}).encode(), {}),
    "an id that is a number": (json.dumps({"inputs": [], "id": 7}).encode(), {}),
    "a raw body of the wrong size": (b"\0" * 7, {"Inference-Header-Content-Length": "0"}),
    "a gzip body that is not gzip": (b"not gzip at all", {"Content-Encoding": "gzip"}),
}


def test_bad_http_bodies_are_400_without_traceback(server: ServerProcess) -> None:
    failures = {}
    for case, (body, headers) in BAD_HTTP_BODIES.items():
        status, _, reply = request(server.http_url, "POST", INFER, body, headers)
        message = json.loads(reply).get("error", "") if reply else ""
        if status != 400 or not message:
            failures[case] = (status, reply[:200])
    assert not failures
    _assert_serving(server)
    assert "Traceback" not in server.log


def test_an_unknown_content_encoding_is_501_as_on_triton(server: ServerProcess) -> None:
    for encoding in ("br", "compress"):
        status, _, reply = request(
            server.http_url, "POST", INFER, _http_input([1], [1.0]), {"Content-Encoding": encoding}
        )
        assert (status, json.loads(reply)) == (501, {"error": "Unsupported compression type"})
    _assert_serving(server)
    assert "Traceback" not in server.log


def test_bad_control_requests_are_4xx_without_traceback(server: ServerProcess) -> None:
    cases = [
        ("POST", "/v2/repository/models/identity/load", b"[1]"),
        ("POST", "/v2/repository/models/identity/load", b'{"parameters": [1]}'),
        ("POST", "/v2/repository/models/identity/load", b'{"parameters": {"config": 7}}'),
        ("POST", "/v2/repository/models/identity/load", b'{"parameters": {"config": "{not json"}}'),
        ("POST", "/v2/repository/models/identity/load", b'{"parameters": {"file:1/model.onnx": 5}}'),
        ("POST", "/v2/repository/models/identity/load", b'{"parameters": {"file:1/model.onnx": "@@"}}'),
        (
            "POST",
            "/v2/repository/models/identity/load",
            json.dumps({"parameters": {"config": "[" * 5000 + "]" * 5000}}).encode(),
        ),
        ("POST", "/v2/repository/models/identity/unload", b'{"parameters": {"unload_dependents": "yes"}}'),
        ("POST", "/v2/repository/index", b'{"ready": "yes"}'),
        ("POST", "/v2/repository/index", b"null"),
        ("GET", "/v2/models/identity/versions/abc/stats", b""),
        ("GET", "/v2/models/identity/versions/-1", b""),
        ("GET", "/v2/models/identity/versions/99999999999999999999999/config", b""),
        ("POST", "/v2/models/identity/versions/x/infer", _http_input([1], [1.0])),
        ("POST", "/v2/models/identity/generate", b'{"INPUT0": {"a": 1}}'),
        ("POST", "/v2/models/identity/generate", b'{"INPUT0": [1], "parameters": 5}'),
        ("POST", "/v2/models/identity/generate", b"[]"),
    ]
    failures = {}
    for method, path, body in cases:
        status, _, reply = request(server.http_url, method, path, body or None)
        if not 400 <= status < 500:
            failures[f"{method} {path} {body[:60]!r}"] = (status, reply[:200])
    assert not failures
    _assert_serving(server)
    assert "Traceback" not in server.log


def test_bad_grpc_requests_are_invalid_argument_without_traceback(server: ServerProcess) -> None:
    messages = {
        "bytes past the end": _grpc_request([1], b"\xff\xff\xff\x7fab"),
        "unknown datatype": _grpc_request([1], b"\0" * 4),
        "negative dimension": _grpc_request([-3], b"\0" * 4),
        "raw contents of the wrong size": _grpc_request([2], b"\0" * 5),
        "a parameter without a value": service_pb2.ModelInferRequest(
            model_name="identity", parameters={"x": service_pb2.InferParameter()}
        ),
        "contents of the wrong type": _grpc_request([1], None),
    }
    messages["bytes past the end"].inputs[0].datatype = "BYTES"
    messages["unknown datatype"].inputs[0].datatype = "FLOAT"
    messages["contents of the wrong type"].inputs[0].contents.int_contents.append(1)
    codes = {}
    for case, message in messages.items():
        code, _ = _grpc_error(server, message)
        codes[case] = code
    assert codes == dict.fromkeys(messages, grpc.StatusCode.INVALID_ARGUMENT)
    _assert_serving(server)
    assert "Traceback" not in server.log


def _health_answers(address: str, count: int) -> None:
    for _ in range(count):
        status, _, _ = request(address, "GET", "/v2/health/ready")
        assert status == 200


class _Request(threading.Thread):
    """One request on a thread of its own; `outcome` holds its answer (or its error) once done."""

    def __init__(self, work: Callable[[], None]) -> None:
        super().__init__()
        self._work = work
        self.outcome: list[BaseException | None] = []

    def run(self) -> None:
        try:
            self._work()
        except BaseException as exc:  # reported by the test
            self.outcome.append(exc)
        else:
            self.outcome.append(None)

    def succeeded(self) -> None:
        self.join(timeout=120)
        assert self.outcome == [None], self.outcome


def test_a_large_json_body_does_not_stall_other_clients(server: ServerProcess) -> None:
    # Nested one-element lists: tens of megabytes whose decoding takes seconds of Python work.
    # On the event loop it held every other client for that long; in a worker process, the
    # loop answers others meanwhile. The worker is stopped while it decodes: the decoding
    # then lasts as long as the test likes, and health probes are answered all the while.
    count = 3_000_000
    values = np.round(np.random.default_rng(7).random(count), 6)
    tensor = {"name": "INPUT0", "datatype": "FP32", "shape": [count], "data": [[v] for v in values.tolist()]}
    body = orjson.dumps(
        {"inputs": [tensor], "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}
    )
    assert len(body) > 30_000_000

    def big_request() -> None:
        status, headers, reply = request(server.http_url, "POST", INFER, body)
        assert status == 200, reply[:200]
        json_length = int(headers["Inference-Header-Content-Length"])
        output = np.frombuffer(reply[json_length:], np.float32)
        assert np.array_equal(output, values.astype(np.float32))

    big = _Request(big_request)
    big.start()
    # The first large body starts the worker; a later one finds it idle and wakes it.
    worker = wait_until(lambda: sorted(worker_pids(server)), "a JSON worker process takes the body")[0]
    idle = cpu_ticks(worker)
    wait_until(lambda: cpu_ticks(worker) > idle + 5, "the worker decodes the body", interval=0.005)
    with stopped(worker):
        _health_answers(server.http_url, 5)
        assert big.is_alive() and not big.outcome  # unanswered while its decoding is held
    big.succeeded()


def test_a_large_compressed_response_does_not_stall_other_clients(tmp_path: Path) -> None:
    # Compressing tens of megabytes takes a good part of a second; zlib lets go of the GIL,
    # so on a worker thread the loop answers others meanwhile. Driven in-process, the server's
    # own compression is held until health probes sent after it began have been answered: on
    # the loop, none could be, and the hold gives up (the compression itself runs unchanged).
    write_model(tmp_path, "identity", identity_model("FP32", ["n"]), IDENTITY)
    values = np.random.default_rng(11).integers(0, 1000, 12_000_000).astype(np.float32)
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [values.size],
                    "parameters": {"binary_data_size": values.nbytes},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    )
    headers = {_HEADER_LENGTH: str(len(header)), "Accept-Encoding": "gzip"}
    compressing = threading.Event()
    probes_answered = threading.Event()
    held: list[bool] = []

    def held_compress(body: bytes, encoding: str) -> bytes:
        if len(body) > 1_000_000:  # the large response, not a probe's
            compressing.set()
            held.append(probes_answered.wait(timeout=60))
        return compress(body, encoding)

    with (
        coreserve.Server(tmp_path, frontends=["http"], http_port=0) as inprocess,
        pytest.MonkeyPatch.context() as patch,
    ):
        patch.setattr(answering, "compress", held_compress)
        address = f"127.0.0.1:{inprocess.ports['http']}"

        def big_request() -> None:
            status, reply_headers, reply = request(address, "POST", INFER, header + values.tobytes(), headers)
            assert status == 200, reply[:200]
            assert reply_headers["Content-Encoding"] == "gzip"
            body = gzip.decompress(reply)
            json_length = int(reply_headers[_HEADER_LENGTH])
            assert np.array_equal(np.frombuffer(body[json_length:], np.float32), values)

        big = _Request(big_request)
        big.start()
        assert compressing.wait(timeout=60), "the large response was never compressed"
        _health_answers(address, 5)
        assert big.is_alive() and not big.outcome  # unanswered while its compression is held
        probes_answered.set()
        big.succeeded()
    assert held == [True]


ECHO = """
backend: "echo"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


def _echo_server(coreserve_server: ServerFactory, repository: Path, echo_backend_site: Path) -> ServerProcess:
    write_model(repository, "echo", b"", ECHO, filename="model.echo")
    pythonpath = os.pathsep.join(filter(None, [str(echo_backend_site), os.environ.get("PYTHONPATH")]))
    return coreserve_server(repository, env={"PYTHONPATH": pythonpath})


def _echo_request(delay_ms: int) -> service_pb2.ModelInferRequest:
    message = service_pb2.ModelInferRequest(model_name="echo")
    message.inputs.add(name="IN", datatype="INT32", shape=[1])
    message.raw_input_contents.append(np.array([7], np.int32).tobytes())
    message.parameters["delay_ms"].int64_param = delay_ms
    return message


def _metric_value(server: ServerProcess, line_start: str) -> float:
    with urllib.request.urlopen(server.metrics_url, timeout=30) as response:
        text = response.read().decode()
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start)]
    assert len(values) == 1, (line_start, text)
    return values[0]


def test_a_request_past_its_grpc_deadline_counts_as_a_failure(
    coreserve_server: ServerFactory, tmp_path: Path, echo_backend_site: Path
) -> None:
    server = _echo_server(coreserve_server, tmp_path, echo_backend_site)
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        stub.ModelInfer(_echo_request(0), timeout=30)
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(_echo_request(1000), timeout=0.3)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # The model still runs the request to its end (cancelling work is another matter);
    # once it has, the statistics and metrics count it as a failure, not a success.
    deadline = time.monotonic() + 30
    while True:
        status, _, reply = request(server.http_url, "GET", "/v2/models/echo/stats")
        stats = json.loads(reply)["model_stats"][0]
        if stats["execution_count"] == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert status == 200
    assert stats["inference_stats"]["success"]["count"] == 1
    assert stats["inference_stats"]["fail"]["count"] == 1
    assert _metric_value(server, 'nv_inference_request_success{model="echo",version="1"}') == 1
    failure = 'nv_inference_request_failure{model="echo",reason="CANCELED",version="1"}'
    assert _metric_value(server, failure) == 1


def test_a_grpc_stream_holds_at_most_its_inflight_limit(
    coreserve_server: ServerFactory, tmp_path: Path, echo_backend_site: Path
) -> None:
    write_model(tmp_path, "echo", b"", ECHO, filename="model.echo")
    pythonpath = os.pathsep.join(filter(None, [str(echo_backend_site), os.environ.get("PYTHONPATH")]))
    server = coreserve_server(tmp_path, "--grpc-max-stream-inflight=2", env={"PYTHONPATH": pythonpath})
    pending_seen: list[float] = []
    done = threading.Event()

    def watch_pending() -> None:
        while not done.is_set():
            pending_seen.append(requests_in(server.metrics_url, "echo"))
            time.sleep(0.02)

    messages = []
    for index in range(8):
        message = _echo_request(150)
        message.id = str(index)
        messages.append(message)
    watcher = threading.Thread(target=watch_pending)
    watcher.start()
    try:
        with grpc.insecure_channel(server.grpc_url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            replies = list(stub.ModelStreamInfer(iter(messages), timeout=60))
    finally:
        done.set()
        watcher.join()
    assert [reply.error_message for reply in replies] == [""] * 8
    assert [reply.infer_response.id for reply in replies] == [str(index) for index in range(8)]
    # The stream read two requests, then waited for an answer before it read the next one:
    # the model never had more than two of them queued or executing (eight without the limit).
    assert max(pending_seen) == 2, pending_seen


FLOOD = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_UINT8 dims: [ -1 ] } ]
"""
# Sends 160 responses of 1 MiB as fast as it can, until its request is cancelled.
FLOOD_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            block = np.zeros(1 << 20, np.uint8)
            for _ in range(160):
                if request.is_cancelled():
                    break
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", block)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


def test_a_stream_its_client_does_not_read_is_cut_off_once_64_mib_wait(
    coreserve_server: ServerFactory, tmp_path: Path
) -> None:
    folder = write_model(tmp_path, "flood", None, FLOOD)
    (folder / "1" / "model.py").write_text(FLOOD_MODEL)
    server = coreserve_server(tmp_path)
    host, port = server.http_url.rsplit(":", 1)
    body = b'{"IN": [1]}'
    with socket.create_connection((host, int(port)), timeout=60) as client:
        client.sendall(
            b"POST /v2/models/flood/generate_stream HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        # Nothing is read: the responses wait in the server until it gives up on the client.
        cancelled = 'nv_inference_request_failure{model="flood",reason="CANCELED",version="1"}'
        wait_until(lambda: _metric_or_zero(server, cancelled) == 1, "the request cancelled", timeout=120)
        received = b""
        while b"taken too slowly" not in received:
            chunk = client.recv(1 << 20)
            assert chunk, received[-500:]
            received += chunk
    assert received.count(b'"OUT"') < 160  # the model stopped early
    assert "Traceback" not in server.log


def _metric_or_zero(server: ServerProcess, line_start: str) -> float:
    with urllib.request.urlopen(server.metrics_url, timeout=30) as response:
        lines = [line for line in response.read().decode().splitlines() if line.startswith(line_start)]
    return float(lines[0].rsplit(" ", 1)[1]) if lines else 0.0


@pytest.mark.parametrize("grpc_server", ["native", "grpcio"])
def test_a_grpc_stream_its_client_does_not_read_is_cut_off_once_64_mib_wait(
    coreserve_server: ServerFactory, tmp_path: Path, grpc_server: str
) -> None:
    folder = write_model(tmp_path, "flood", None, FLOOD)
    (folder / "1" / "model.py").write_text(FLOOD_MODEL)
    server = coreserve_server(tmp_path, f"--grpc-server={grpc_server}")
    message = service_pb2.ModelInferRequest(model_name="flood", id="flooding")
    tensor = message.inputs.add(name="IN", datatype="INT32", shape=[1])
    tensor.contents.int_contents.append(1)
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        replies = stub.ModelStreamInfer(iter([message]), timeout=120)
        # Nothing is read: the responses wait in the server until it gives up on the client.
        cancelled = 'nv_inference_request_failure{model="flood",reason="CANCELED",version="1"}'
        wait_until(lambda: _metric_or_zero(server, cancelled) == 1, "the request cancelled", timeout=120)
        received = list(replies)
    assert 0 < len(received) < 160  # the model stopped early
    *answers, last = received
    assert all(reply.error_message == "" for reply in answers)
    assert last.infer_response.id == "flooding"
    assert last.error_message.startswith("the responses were taken too slowly: more than 67108864 bytes")
    assert "Traceback" not in server.log
