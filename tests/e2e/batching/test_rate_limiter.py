"""The rate limiter end to end: `--rate-limit=execution_count` with Python models that mark their executions.

Every model runs tests/e2e/batching/rate_limiter_models/marker.py, which appends "enter <model>" and
"exit <model>" to one file as each execution starts and ends, so the tests read what ran, in
which order and whether two ran at once, from the server's own behaviour rather than from
timings. A `gate` model holds the one copy of resource ONE until the test creates its gate
file, so the requests sent meanwhile all wait in the limiter, and the order in which they run
then is the limiter's choice alone.
"""

from __future__ import annotations

import json
import re
import shutil
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from coreserve.testing import ServerFactory, ServerProcess
from support.model_builders import scale_model, write_model

MARKER_MODEL = Path(__file__).resolve().parent / "rate_limiter_models" / "marker.py"
CONFIG = """
backend: "python"
max_batch_size: 0
input [ {{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU rate_limiter {{ {rate_limiter} }} }} ]
parameters {{ key: "markers" value: {{ string_value: "{markers}" }} }}
{extra}
"""
# name: (instances, rate_limiter, extra config)
MODELS = {
    # Each instance needs both copies of WHOLE (its default count is the most any asks for: 2).
    "left": (2, 'resources [ { name: "WHOLE" count: 2 } ]', ""),
    "right": (2, 'resources [ { name: "WHOLE" count: 2 } ]', ""),
    # ONE has one copy: these run one at a time, in the order the limiter picks.
    "gate": (1, 'resources [ { name: "ONE" count: 1 } ]', ""),
    "first": (1, 'resources [ { name: "ONE" count: 1 } ] priority: 1', ""),
    "second": (1, 'resources [ { name: "ONE" count: 1 } ] priority: 2', ""),
    "urgent": (1, 'resources [ { name: "ONE" count: 1 } ]', "optimization { priority: PRIORITY_MAX }"),
    "later": (1, 'resources [ { name: "ONE" count: 1 } ]', "optimization { priority: PRIORITY_MIN }"),
}
REQUESTS = 12


class Markers:
    """The marker file the models append to, read from where a test began."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._start = 0

    def begin(self) -> None:
        self._start = self.path.stat().st_size if self.path.exists() else 0

    def events(self) -> list[tuple[str, str]]:
        if not self.path.exists():
            return []
        with self.path.open() as file:
            file.seek(self._start)
            return [tuple(line.split()) for line in file.read().splitlines()]  # type: ignore[misc]

    def entered(self, *models: str) -> str:
        """The models' executions in the order they began, one letter per model (its first)."""
        return "".join(model[0] for event, model in self.events() if event == "enter" and model in models)


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gate") / "open"


@pytest.fixture(scope="module")
def markers(tmp_path_factory: pytest.TempPathFactory) -> Markers:
    return Markers(tmp_path_factory.mktemp("markers") / "markers.txt")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, markers: Markers, gate: Path) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("rate-limited")
    for name, (count, rate_limiter, extra) in MODELS.items():
        if name == "gate":
            extra = f'parameters {{ key: "gate" value: {{ string_value: "{gate}" }} }}'
        config = CONFIG.format(count=count, rate_limiter=rate_limiter, markers=markers.path, extra=extra)
        folder = write_model(repository, name, None, config)
        shutil.copy(MARKER_MODEL, folder / "1" / "model.py")
    process = ServerProcess([repository], ["--rate-limit=execution_count"])
    try:
        process.start(timeout=180)
        yield process
        log = process.log
    finally:
        process.close()
    assert "Traceback" not in log, log


class Client:
    """Sends inference requests from threads of its own, so they stay in flight while a test
    polls (tritonclient's async_infer runs on gevent, which a test sleeping in time.sleep starves)."""

    def __init__(self, server: ServerProcess) -> None:
        self._url = f"http://{server.http_url}/v2/models"
        self._pool = ThreadPoolExecutor(4 * REQUESTS)

    def send(self, model: str, count: int, milliseconds: int = 0) -> list[Future[int]]:
        return [self._pool.submit(self._infer, model, milliseconds) for _ in range(count)]

    def _infer(self, model: str, milliseconds: int) -> int:
        body = json.dumps(
            {"inputs": [{"name": "X", "shape": [1], "datatype": "INT32", "data": [milliseconds]}]}
        )
        request = urllib.request.Request(f"{self._url}/{model}/infer", body.encode(), method="POST")
        with urllib.request.urlopen(request, timeout=120) as reply:
            return int(json.loads(reply.read())["outputs"][0]["data"][0])

    def close(self) -> None:
        self._pool.shutdown(cancel_futures=True)


@pytest.fixture
def client(server: ServerProcess) -> Iterator[Client]:
    client = Client(server)
    yield client
    client.close()


def _answers(requests: list[Future[int]]) -> list[int]:
    """Each request's Y (raises if a request failed: the limiter delays, never fails)."""
    return [request.result(timeout=180) for request in requests]


def _pending(server: ServerProcess, model: str) -> int:
    with urllib.request.urlopen(server.metrics_url, timeout=30) as reply:
        text = reply.read().decode()
    found = re.search(rf'nv_inference_pending_request_count\{{model="{model}",version="1"\}} (\d+)', text)
    assert found, text
    return int(found.group(1))


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        time.sleep(0.05)


def _behind_the_gate(
    server: ServerProcess,
    client: Client,
    markers: Markers,
    gate: Path,
    models: list[str],
) -> str:
    """Sends REQUESTS requests to each model while the gate holds ONE, then opens it; returns
    the models' executions in order (one letter each)."""
    gate.unlink(missing_ok=True)
    markers.begin()
    held = client.send("gate", 1)
    _wait_for(lambda: markers.entered("gate") == "g", "the gate model runs")
    waiting = {model: client.send(model, REQUESTS) for model in models}
    for model in models:
        _wait_for(
            lambda model=model: _pending(server, model) == REQUESTS, f"{REQUESTS} requests for '{model}' wait"
        )
    gate.touch()
    assert _answers(held) == [0]
    for requests in waiting.values():
        assert _answers(requests) == [0] * REQUESTS
    order = markers.entered(*models)
    assert len(order) == REQUESTS * len(models)
    return order


def test_two_models_needing_the_whole_of_one_resource_never_execute_at_once(
    client: Client, markers: Markers
) -> None:
    markers.begin()
    requests = client.send("left", REQUESTS, milliseconds=30) + client.send(
        "right", REQUESTS, milliseconds=30
    )
    assert _answers(requests) == [30] * (2 * REQUESTS)  # delayed, never failed
    running = most = 0
    for event, model in markers.events():
        if model in ("left", "right"):
            running += 1 if event == "enter" else -1
            most = max(most, running)
    assert most == 1
    order = markers.entered("left", "right")
    assert sorted(order) == sorted("l" * REQUESTS + "r" * REQUESTS)
    assert "lr" in order or "rl" in order  # both models had turns while the other waited


def test_a_priority_two_instance_gets_half_the_executions_of_a_priority_one_instance(
    server: ServerProcess, client: Client, markers: Markers, gate: Path
) -> None:
    order = _behind_the_gate(server, client, markers, gate, ["first", "second"])
    contended = order[: REQUESTS + REQUESTS // 2]  # both still have requests waiting
    # Turns go by executions x priority: first, second, first, first, second, ...
    assert abs(contended.count("s") - len(contended) / 3) <= 1, order


def test_model_priority_max_runs_all_its_work_before_priority_min(
    server: ServerProcess, client: Client, markers: Markers, gate: Path
) -> None:
    order = _behind_the_gate(server, client, markers, gate, ["later", "urgent"])
    assert order == "u" * REQUESTS + "l" * REQUESTS


def test_a_resource_no_flag_gives_makes_the_model_unavailable_with_the_reason(
    coreserve_server: ServerFactory, tmp_path: Path
) -> None:
    scale = """
backend: "onnxruntime"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { kind: KIND_CPU rate_limiter { resources [ { name: "%s" count: 2 } ] } } ]
"""
    write_model(tmp_path, "given", scale_model(2.0), scale % "R1")
    write_model(tmp_path, "missing", scale_model(3.0), scale % "GPU_MEMORY")
    server = coreserve_server(
        tmp_path, "--rate-limit=execution_count", "--rate-limit-resource=R1:4", "--exit-on-error=false"
    )
    with httpclient.InferenceServerClient(server.http_url) as client:
        assert client.is_model_ready("given") and not client.is_model_ready("missing")
        tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        assert float(client.infer("given", [tensor]).as_numpy("OUTPUT0")[0, 0]) == 2.0
        reasons = {entry["name"]: entry.get("reason", "") for entry in client.get_model_repository_index()}
    expected = (
        'Resource count for "GPU_MEMORY" is limited to 0 which will prevent scheduling of one or more '
        "model instances, the minimum required count is 2"
    )
    assert expected in reasons["missing"]
    logged = json.dumps(expected)[1:-1]  # (as the log writes it: JSON-encoded)
    errors = [line for line in server.log.splitlines() if line.startswith("E") and logged in line]
    assert len(errors) == 1 and "Traceback" not in server.log, server.log


def test_a_malformed_resource_flag_stops_the_server_with_the_format(tmp_path: Path) -> None:
    server = ServerProcess([tmp_path], ["--rate-limit=execution_count", "--rate-limit-resource=R1"])
    try:
        with pytest.raises(RuntimeError) as error:
            server.start(timeout=60)
    finally:
        server.close()
    assert "--rate-limit-resource option format is '<resource_name>:<count>:<device>'" in str(error.value)
    assert "Traceback" not in str(error.value)
