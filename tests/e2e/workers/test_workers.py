"""A server of several workers (`--http-thread-count`, `--grpc-infer-thread-count`) is one
server to its clients: what one connection changes, every connection sees; the statistics and
metrics are the totals (and stay so when a worker dies); a worker that dies is started again
while the others serve; one Triton trace file; SIGTERM stops them all. The models that worker
0 serves for every worker: test_single_copy.py.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

from coreserve.testing import ServerProcess
from support.model_builders import (
    ADD_SUB_CONFIG,
    add_sub_model,
    pipeline_config,
    write_echo_that_loads,
    write_model,
)
from support.servers.worker_servers import (
    ADD_BODY,
    CONNECTIONS,
    SCALE_CONFIG,
    answer_of,
    free_port,
    start_workers,
    status_of,
    urlopen_text,
    worker_pids,
    write_repository,
)
from support.waiting import wait_until


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_repository(tmp_path_factory.mktemp("workers"))


@pytest.fixture
def server(repository: Path) -> Iterator[ServerProcess]:
    process = start_workers(repository)
    yield process
    process.close()


def test_statistics_and_metrics_are_the_totals_of_every_worker(server: ServerProcess) -> None:
    assert len(worker_pids(server)) == 2
    for _ in range(CONNECTIONS):
        status, body = answer_of(server, "POST", "/v2/models/add_sub/infer", ADD_BODY)
        assert status == 200, body
        assert json.loads(body)["outputs"][0]["data"] == [2, 3, 4, 5]
    status, body = answer_of(server, "GET", "/v2/models/add_sub/stats")
    (stats,) = json.loads(body)["model_stats"]
    assert stats["inference_count"] == stats["inference_stats"]["success"]["count"] == CONNECTIONS
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        stats = client.get_inference_statistics("add_sub", as_json=True)["model_stats"][0]
        assert int(stats["inference_count"]) == CONNECTIONS
    metrics = urlopen_text(server.metrics_url)
    assert f'nv_inference_request_success{{model="add_sub",version="1"}} {CONNECTIONS}' in metrics
    assert metrics.count("# TYPE nv_inference_request_success counter") == 1
    assert len([line for line in metrics.splitlines() if line.startswith("nv_cpu_utilization ")]) == 1
    # Each worker's copy of the ONNX model takes its share of the cores, not all of them (one
    # line per instance: two copies of the two CPU instances onnxruntime models have by default).
    shares = re.findall(
        r"model 'add_sub': (\d+) intra-op thread\(s\) per instance, the share of 2 copies", server.log
    )
    assert shares == [str(max(1, len(os.sched_getaffinity(0)) // 2))] * 4


def test_a_model_loaded_or_unloaded_through_one_connection_is_so_for_every_connection(
    server: ServerProcess,
) -> None:
    body = json.dumps(
        {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    )
    assert status_of(server, "POST", "/v2/models/scale/infer", body) == 404  # not loaded anywhere
    with httpclient.InferenceServerClient(server.http_url) as client:
        client.load_model("scale")
    for _ in range(CONNECTIONS):
        status, answer = answer_of(server, "POST", "/v2/models/scale/infer", body)
        assert status == 200, answer
        assert json.loads(answer)["outputs"][0]["data"] == [2, 4, 6, 8]
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.unload_model("scale")
    assert {status_of(server, "POST", "/v2/models/scale/infer", body) for _ in range(CONNECTIONS)} == {404}
    index = json.loads(answer_of(server, "POST", "/v2/repository/index", "{}")[1])
    assert {entry["name"]: entry.get("state") for entry in index}["scale"] == "UNAVAILABLE"


@pytest.mark.parametrize("when", ["at start", "by a client"])
def test_a_model_that_loads_another_as_it_loads_is_served_by_every_worker(tmp_path: Path, when: str) -> None:
    """Each worker loads the model, and so makes the load its initialize() asks for. Loaded by a
    client, that load was relayed to every worker, where it waited for the load that runs it,
    which waited for it: the server hung. (At start no worker has joined: each makes it.)"""
    # first loads second as it starts, and unloads it as it serves (a client's change then).
    write_echo_that_loads(tmp_path, "first", loads="second", unloads="second")
    write_echo_that_loads(tmp_path, "second")
    server = start_workers(
        tmp_path, "--model-control-mode=explicit", *(["--load-model=first"] if when == "at start" else [])
    )
    try:
        if when == "by a client":
            with httpclient.InferenceServerClient(server.http_url, network_timeout=120) as client:
                client.load_model("first")
        for name in ("first", "second"):
            assert {status_of(server, "GET", f"/v2/models/{name}/ready") for _ in range(CONNECTIONS)} == {200}
        body = json.dumps(
            {"inputs": [{"name": "A", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
        )
        assert status_of(server, "POST", "/v2/models/first/infer", body) == 200  # and it unloads second
        assert {status_of(server, "GET", "/v2/models/second/ready") for _ in range(CONNECTIONS)} == {400}
        assert "Traceback" not in server.log
    finally:
        server.close()


def test_a_shared_memory_region_registered_through_one_connection_serves_every_connection(
    server: ServerProcess,
) -> None:
    data = np.array([[1, 2, 3, 4]], dtype=np.float32)
    region = shm.create_shared_memory_region("workers_inputs", "/workers_inputs", 2 * data.nbytes)
    try:
        shm.set_shared_memory_region(region, [data, data])
        with httpclient.InferenceServerClient(server.http_url) as client:
            client.register_system_shared_memory("workers_inputs", "/workers_inputs", 2 * data.nbytes)
        for _ in range(CONNECTIONS // 4):
            with grpcclient.InferenceServerClient(server.grpc_url) as client:
                inputs = [grpcclient.InferInput(name, [1, 4], "FP32") for name in ("INPUT0", "INPUT1")]
                inputs[0].set_shared_memory("workers_inputs", data.nbytes)
                inputs[1].set_shared_memory("workers_inputs", data.nbytes, offset=data.nbytes)
                result = client.infer("add_sub", inputs)
                assert result.as_numpy("OUTPUT0").tolist() == [[2, 4, 6, 8]]
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            client.unregister_system_shared_memory("workers_inputs")
        for _ in range(CONNECTIONS // 4):
            status, body = answer_of(server, "GET", "/v2/systemsharedmemory/status")
            assert (status, json.loads(body)) == (200, [])
    finally:
        shm.destroy_shared_memory_region(region)


def test_log_settings_changed_through_one_connection_are_every_workers(server: ServerProcess) -> None:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.update_log_settings({"log_verbose_level": 1})
    for _ in range(CONNECTIONS // 2):
        status, body = answer_of(server, "GET", "/v2/logging")
        assert status == 200 and json.loads(body)["log_verbose_level"] == 1


def _add_sub_counts(server: ServerProcess) -> tuple[int, int]:
    """add_sub's inference count in the statistics of every model, and its success counter."""
    status, body = answer_of(server, "GET", "/v2/models/stats")
    assert status == 200, body
    (stats,) = [model for model in json.loads(body)["model_stats"] if model["name"] == "add_sub"]
    metrics = urlopen_text(server.metrics_url)
    success = re.search(r'^nv_inference_request_success\{model="add_sub",version="1"\} (\d+)$', metrics, re.M)
    assert success is not None
    return int(stats["inference_count"]), int(success[1])


def test_a_worker_that_dies_is_started_again_while_the_others_serve(repository: Path) -> None:
    server = start_workers(repository)
    try:
        with httpclient.InferenceServerClient(server.http_url) as client:
            client.load_model("scale")  # made after the start: the new worker must make it too
        host, port = server.http_url.split(":")
        connections = [http.client.HTTPConnection(host, int(port), timeout=30) for _ in range(16)]
        for connection in connections:  # each now belongs to one worker
            connection.request("POST", "/v2/models/add_sub/infer", body=ADD_BODY)
            assert connection.getresponse().read()
        counted = _add_sub_counts(server)  # every worker's figures, seen by the supervisor now
        first, second = worker_pids(server)
        os.kill(second, signal.SIGKILL)
        outcomes = []
        for connection in connections:
            answers = []
            for _ in range(5):
                try:
                    connection.request("POST", "/v2/models/add_sub/infer", body=ADD_BODY)
                    response = connection.getresponse()
                    response.read()
                    answers.append(response.status)
                except (OSError, http.client.HTTPException):
                    answers.append(0)
                    break
            outcomes.append(answers)
        # A connection of the worker that died fails at once; those of the other never fail.
        assert all(answers in ([200] * 5, [0]) for answers in outcomes), outcomes
        assert [200] * 5 in outcomes
        wait_until(
            lambda: len(worker_pids(server)) == 2 and second not in worker_pids(server), "a new worker"
        )
        wait_until(lambda: status_of(server, "GET", "/v2/health/ready") == 200, "ready again", timeout=120)
        assert first in worker_pids(server)
        # What the dead worker had counted stays counted: the server's totals do not fall back.
        answered = sum(answers.count(200) for answers in outcomes)
        assert _add_sub_counts(server) == (counted[0] + answered, counted[1] + answered)
        body = json.dumps(
            {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 1, 1, 1]}]}
        )
        assert {status_of(server, "POST", "/v2/models/scale/infer", body) for _ in range(CONNECTIONS)} == {
            200
        }
        for connection in connections:
            connection.close()
    finally:
        server.close()


PIPELINE = pipeline_config(8)
PIPELINE_BODY = json.dumps(
    {
        "inputs": [
            {"name": name, "shape": [1, 4], "datatype": "FP32", "data": [1, 1, 1, 1]} for name in ("A", "B")
        ]
    }
)


def test_a_worker_started_again_brings_back_with_the_others_an_ensemble_an_unload_took_down(
    tmp_path: Path,
) -> None:
    write_model(tmp_path, "add_sub", add_sub_model(), ADD_SUB_CONFIG)
    (tmp_path / "pipeline" / "1").mkdir(parents=True)
    (tmp_path / "pipeline" / "config.pbtxt").write_text(PIPELINE)
    server = start_workers(tmp_path, "--load-model=pipeline")
    try:
        with httpclient.InferenceServerClient(server.http_url) as client:
            client.unload_model("add_sub")  # takes pipeline down in every worker
        second = worker_pids(server)[1]
        os.kill(second, signal.SIGKILL)
        wait_until(
            lambda: len(worker_pids(server)) == 2 and second not in worker_pids(server), "a new worker"
        )
        wait_until(lambda: status_of(server, "GET", "/v2/health/ready") == 200, "ready again", timeout=120)
        with httpclient.InferenceServerClient(server.http_url) as client:
            client.load_model("add_sub")  # brings pipeline back in every worker, the new one too
        assert {
            status_of(server, "POST", "/v2/models/pipeline/infer", PIPELINE_BODY) for _ in range(CONNECTIONS)
        } == {200}
    finally:
        server.close()


def test_one_triton_trace_file_holds_every_workers_traces(repository: Path, tmp_path: Path) -> None:
    """Worker 0 writes the one trace file; the other worker sends it each trace as it ends,
    numbered apart (worker i of 2: i + 1, i + 3, ...)."""
    trace_file = tmp_path / "trace.json"
    server = start_workers(repository, "--trace-config", f"triton,file={trace_file}",
                    "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1")  # fmt: skip
    try:
        for index in range(CONNECTIONS // 2):
            body = json.loads(ADD_BODY)
            body["id"] = f"request-{index}"
            assert answer_of(server, "POST", "/v2/models/add_sub/infer", json.dumps(body))[0] == 200
        assert server.process is not None
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=60) == 0
    finally:
        server.close()
    entries = json.loads(trace_file.read_text())
    records = {entry["id"]: entry["request_id"] for entry in entries if "model_name" in entry}
    assert sorted(records.values()) == sorted(f"request-{index}" for index in range(CONNECTIONS // 2))
    assert {trace_id % 2 for trace_id in records} == {0, 1}  # both workers' traces
    assert not list(tmp_path.glob("trace.json.*"))


def test_sigterm_stops_every_worker(repository: Path) -> None:
    server = start_workers(repository, "--exit-timeout-secs=10")
    try:
        workers = worker_pids(server)
        assert server.process is not None
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=60) == 0
        assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()]
        assert server.log.count("coreserve stopped") == 3  # each worker, then the supervisor
    finally:
        server.close()  # (its log file too)


STUCK_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
STUCK_MODEL = """
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        open({started!r}, "w").close()
        time.sleep(3600)
"""


def test_an_exit_timeout_that_cuts_a_request_ends_the_server_with_status_1(tmp_path: Path) -> None:
    """As one server does, and Triton: the worker whose exit timeout cut a request exits 1, so
    the server does (the other may too: worker 0 waits for the others' end within the same
    timeout, which can leave its own models none)."""
    repository = write_repository(tmp_path / "models")
    started = tmp_path / "executing"
    write_model(repository, "stuck", STUCK_MODEL.format(started=str(started)).encode(),
                STUCK_CONFIG, filename="model.py")  # fmt: skip
    server = start_workers(repository, "--model-control-mode=explicit", "--load-model=add_sub",
                           "--load-model=stuck", "--exit-timeout-secs=1")  # fmt: skip
    body = '{"inputs": [{"name": "X", "datatype": "INT32", "shape": [1], "data": [1]}]}'
    try:
        with ThreadPoolExecutor(1) as pool:
            stuck = pool.submit(status_of, server, "POST", "/v2/models/stuck/infer", body)
            wait_until(started.exists, "the request reached execute()")
            assert server.process is not None
            server.process.send_signal(signal.SIGTERM)
            assert server.process.wait(timeout=60) == 1
            assert stuck.result(timeout=30) == 0  # its connection was cut
        log = server.log
    finally:
        server.close()
    assert log.count("failed to stop server: Internal - Exit timeout expired. Exiting immediately.") >= 1
    assert log.count("coreserve stopped") == 3 and "Traceback" not in log


def test_a_start_that_fails_stops_the_server(repository: Path, tmp_path: Path) -> None:
    write_model(tmp_path, "broken", b"not an onnx model", SCALE_CONFIG)
    command = [sys.executable, "-m", "coreserve", f"--model-repository={tmp_path}", "--http-thread-count=2",
               f"--http-port={free_port()}", f"--grpc-port={free_port()}", "--metrics-port=0"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "some models failed to load" in done.stderr and "before serving; stopping" in done.stderr
    assert "Traceback" not in done.stderr


def test_shared_ports_must_be_named() -> None:
    command = [
        sys.executable,
        "-m",
        "coreserve",
        "--model-repository=.",
        "--http-thread-count=2",
        "--http-port=0",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--http-port=0 (any free port) cannot be shared by several workers" in done.stderr
