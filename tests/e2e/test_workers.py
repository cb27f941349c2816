"""A server of several workers (`--http-thread-count`, `--grpc-infer-thread-count`) is one
server to its clients: what one connection changes, every connection sees; the statistics and
metrics are the totals; a worker that dies is started again while the others serve; SIGTERM
stops them all.

Each new connection may land on any worker (the kernel spreads them over the shared port), so
the tests open a new connection per request where "every worker" matters: over 40 connections
the chance that one worker got them all is 2**-39.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import queue
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from coreserve.server.workers._frames import frame, read_frame
from coreserve.server.workers._owner import owner_socket
from coreserve.testing import ServerProcess
from model_builders import ADD_SUB_CONFIG, accumulator_model, add_sub_model, scale_model, write_model
from waiting import wait_until

CONNECTIONS = 40
SCALE_CONFIG = """
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
SEQUENCE_CONFIG = """
backend: "onnxruntime"
max_batch_size: 2
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "CORR_OUT" data_type: TYPE_UINT64 dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
sequence_batching {
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
  state [ { input_name: "acc_in" output_name: "acc_out" data_type: TYPE_INT32 dims: [ 1 ] } ]
}
"""
ADD_BODY = json.dumps(
    {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
            {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": [1, 1, 1, 1]},
        ]
    }
)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("workers")
    write_model(root, "add_sub", add_sub_model(), ADD_SUB_CONFIG)
    write_model(root, "scale", scale_model(2.0), SCALE_CONFIG)
    write_model(root, "counter", accumulator_model(), SEQUENCE_CONFIG)
    models = Path(__file__).parent / "cancellation_models"
    shutil.copytree(models / "sleepy_sequence", root / "sleepy_sequence")
    # The same, 4 s to load: its load on demand takes a while.
    shutil.copytree(models / "sleepy_sequence", root / "slow_sequence")
    with (root / "slow_sequence" / "1" / "model.py").open("a") as source:
        source.write("\n    def initialize(self, args):\n        time.sleep(4)\n")
    # A decoupled model made single-copy by a sequence batcher: its responses are sent on.
    shutil.copytree(models / "streamer", root / "sequence_streamer")
    with (root / "sequence_streamer" / "config.pbtxt").open("a") as config:
        config.write("sequence_batching { }\n")
    return root


def _start(
    repository: Path, *args: str, workers: int = 2, env: dict[str, str] | None = None
) -> ServerProcess:
    server = ServerProcess(
        [repository],
        [
            f"--http-port={_free_port()}",
            f"--grpc-port={_free_port()}",
            f"--http-thread-count={workers}",
            f"--grpc-infer-thread-count={workers}",
            "--model-control-mode=explicit",
            "--load-model=add_sub",
            *args,
        ],
        env,
    ).start(timeout=120)
    wait_until(lambda: _status(server, "GET", "/v2/health/ready") == 200, "every worker ready", timeout=120)
    return server


@pytest.fixture
def server(repository: Path) -> Iterator[ServerProcess]:
    process = _start(repository)
    yield process
    process.close()


def _request(server: ServerProcess, method: str, path: str, body: str | None = None) -> tuple[int, bytes]:
    """One request on a connection of its own: it may land on any worker."""
    host, port = server.http_url.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request(method, path, body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _status(server: ServerProcess, method: str, path: str, body: str | None = None) -> int:
    try:
        return _request(server, method, path, body)[0]
    except OSError:
        return 0


def _workers(server: ServerProcess) -> list[int]:
    """The supervisor's children: its workers."""
    assert server.process is not None
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if parent == server.process.pid:
                children.append(int(entry.name))
    return sorted(children)


def test_statistics_and_metrics_are_the_totals_of_every_worker(server: ServerProcess) -> None:
    assert len(_workers(server)) == 2
    for _ in range(CONNECTIONS):
        status, body = _request(server, "POST", "/v2/models/add_sub/infer", ADD_BODY)
        assert status == 200, body
        assert json.loads(body)["outputs"][0]["data"] == [2, 3, 4, 5]
    status, body = _request(server, "GET", "/v2/models/add_sub/stats")
    (stats,) = json.loads(body)["model_stats"]
    assert stats["inference_count"] == stats["inference_stats"]["success"]["count"] == CONNECTIONS
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        stats = client.get_inference_statistics("add_sub", as_json=True)["model_stats"][0]
        assert int(stats["inference_count"]) == CONNECTIONS
    metrics = urlopen_text(server.metrics_url)
    assert f'nv_inference_request_success{{model="add_sub",version="1"}} {CONNECTIONS}' in metrics
    assert metrics.count("# TYPE nv_inference_request_success counter") == 1
    assert len([line for line in metrics.splitlines() if line.startswith("nv_cpu_utilization ")]) == 1
    # Each worker's copy of the ONNX model takes its share of the cores, not all of them.
    shares = re.findall(
        r"model 'add_sub': (\d+) intra-op thread\(s\) per instance, the share of 2 copies", server.log
    )
    assert shares == [str(max(1, len(os.sched_getaffinity(0)) // 2))] * 2


def urlopen_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as answer:
        return str(answer.read().decode())


def test_a_model_loaded_or_unloaded_through_one_connection_is_so_for_every_connection(
    server: ServerProcess,
) -> None:
    body = json.dumps(
        {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    )
    assert _status(server, "POST", "/v2/models/scale/infer", body) == 404  # not loaded anywhere
    with httpclient.InferenceServerClient(server.http_url) as client:
        client.load_model("scale")
    for _ in range(CONNECTIONS):
        status, answer = _request(server, "POST", "/v2/models/scale/infer", body)
        assert status == 200, answer
        assert json.loads(answer)["outputs"][0]["data"] == [2, 4, 6, 8]
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.unload_model("scale")
    assert {_status(server, "POST", "/v2/models/scale/infer", body) for _ in range(CONNECTIONS)} == {404}
    index = json.loads(_request(server, "POST", "/v2/repository/index", "{}")[1])
    assert {entry["name"]: entry.get("state") for entry in index}["scale"] == "UNAVAILABLE"


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
            status, body = _request(server, "GET", "/v2/systemsharedmemory/status")
            assert (status, json.loads(body)) == (200, [])
    finally:
        shm.destroy_shared_memory_region(region)


def test_log_settings_changed_through_one_connection_are_every_workers(server: ServerProcess) -> None:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.update_log_settings({"log_verbose_level": 1})
    for _ in range(CONNECTIONS // 2):
        status, body = _request(server, "GET", "/v2/logging")
        assert status == 200 and json.loads(body)["log_verbose_level"] == 1


def _sequence_step(
    server: ServerProcess,
    sequence_id: int,
    value: int,
    *,
    start: bool,
    end: bool,
    grpc: bool,
    model: str = "counter",
) -> int:
    """One request of a sequence on a connection of its own (it may land on any worker)."""
    module: Any = grpcclient if grpc else httpclient
    with module.InferenceServerClient(server.grpc_url if grpc else server.http_url) as client:
        tensor = module.InferInput("INPUT", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[value]], np.int32))
        result = client.infer(
            model, [tensor], sequence_id=sequence_id, sequence_start=start, sequence_end=end
        )
    assert int(result.as_numpy("CORR_OUT")[0, 0]) == sequence_id
    return int(result.as_numpy("OUTPUT")[0, 0])


def test_a_sequence_keeps_its_state_whichever_worker_its_requests_reach(server: ServerProcess) -> None:
    """A sequence model is served by worker 0 for every worker: the others send it their
    requests, so a sequence's running sum holds over requests that reach different workers."""
    with httpclient.InferenceServerClient(server.http_url) as client:
        client.load_model("counter")
    assert {_status(server, "GET", "/v2/models/counter/ready") for _ in range(CONNECTIONS // 2)} == {200}
    sequences = {7: [1, 2, 3, 4, 5, 6, 7, 8], 8: [10, 20, 30, 40, 50, 60, 70, 80]}
    sums: dict[int, list[int]] = {sid: [] for sid in sequences}
    for step in range(8):  # interleaved, over HTTP and gRPC alternately
        for sid, values in sequences.items():
            last = step == len(values) - 1
            sums[sid].append(
                _sequence_step(server, sid, values[step], start=step == 0, end=last, grpc=step % 2 == 1)
            )
    for sid, values in sequences.items():
        assert sums[sid] == list(np.cumsum(values)), sid
    # A request of no started sequence gets worker 0's error, whichever worker it reaches.
    answers = set()
    for _ in range(CONNECTIONS // 4):
        with pytest.raises(InferenceServerException) as refused:
            _sequence_step(server, 99, 1, start=False, end=False, grpc=False)
        answers.add((refused.value.status(), refused.value.message()))
    assert len(answers) == 1, answers
    status, message = answers.pop()
    assert status == "400" and "must set sequence_start" in message
    # Counted once, where they ran.
    with httpclient.InferenceServerClient(server.http_url) as client:
        stats = client.get_inference_statistics("counter")["model_stats"][0]
    assert stats["inference_count"] == 16 and stats["inference_stats"]["success"]["count"] == 16
    with httpclient.InferenceServerClient(server.http_url) as client:
        client.unload_model("counter")
    assert {_status(server, "GET", "/v2/models/counter/ready") for _ in range(CONNECTIONS // 2)} == {400}
    assert "Traceback" not in server.log


def _add_sub_counts(server: ServerProcess) -> tuple[int, int]:
    """add_sub's inference count in the statistics of every model, and its success counter."""
    status, body = _request(server, "GET", "/v2/models/stats")
    assert status == 200, body
    (stats,) = [model for model in json.loads(body)["model_stats"] if model["name"] == "add_sub"]
    metrics = urlopen_text(server.metrics_url)
    success = re.search(r'^nv_inference_request_success\{model="add_sub",version="1"\} (\d+)$', metrics, re.M)
    assert success is not None
    return int(stats["inference_count"]), int(success[1])


def test_a_worker_that_dies_is_started_again_while_the_others_serve(repository: Path) -> None:
    server = _start(repository)
    try:
        with httpclient.InferenceServerClient(server.http_url) as client:
            client.load_model("scale")  # made after the start: the new worker must make it too
        host, port = server.http_url.split(":")
        connections = [http.client.HTTPConnection(host, int(port), timeout=30) for _ in range(16)]
        for connection in connections:  # each now belongs to one worker
            connection.request("POST", "/v2/models/add_sub/infer", body=ADD_BODY)
            assert connection.getresponse().read()
        counted = _add_sub_counts(server)  # every worker's figures, seen by the supervisor now
        first, second = _workers(server)
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
        wait_until(lambda: len(_workers(server)) == 2 and second not in _workers(server), "a new worker")
        wait_until(lambda: _status(server, "GET", "/v2/health/ready") == 200, "ready again", timeout=120)
        assert first in _workers(server)
        # What the dead worker had counted stays counted: the server's totals do not fall back.
        answered = sum(answers.count(200) for answers in outcomes)
        assert all(now >= then + answered for now, then in zip(_add_sub_counts(server), counted, strict=True))
        body = json.dumps(
            {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 1, 1, 1]}]}
        )
        assert {_status(server, "POST", "/v2/models/scale/infer", body) for _ in range(CONNECTIONS)} == {200}
        for connection in connections:
            connection.close()
    finally:
        server.close()


def test_a_single_copy_model_mended_and_loaded_again_is_ready_in_every_worker(
    repository: Path, tmp_path: Path
) -> None:
    """Worker 0 told the others that its load failed; their next load of the model is judged
    by worker 0's next word, not that old one."""
    write_model(tmp_path, "add_sub", add_sub_model(), ADD_SUB_CONFIG)
    write_model(tmp_path, "mended", b"not an onnx model", SEQUENCE_CONFIG)
    # (Without auto-completion the configuration is read from the file alone: only worker 0,
    # which loads the model, finds the model file broken.)
    server = _start(tmp_path, "--disable-auto-complete-config")
    try:
        with httpclient.InferenceServerClient(server.http_url) as client:
            with pytest.raises(InferenceServerException):
                client.load_model("mended")
            wait_until(  # worker 0 tells the others its model failed
                lambda: {_status(server, "GET", "/v2/models/mended/ready") for _ in range(10)} == {400},
                "not ready anywhere",
            )
            write_model(tmp_path, "mended", accumulator_model(), SEQUENCE_CONFIG)
            client.load_model("mended")
        assert {_status(server, "GET", "/v2/models/mended/ready") for _ in range(CONNECTIONS // 2)} == {200}
        values = [4, 5, 6]
        sums = [
            _sequence_step(server, 3, value, start=step == 0, end=step == 2, grpc=False, model="mended")
            for step, value in enumerate(values)
        ]
        assert sums == [4, 9, 15]
    finally:
        server.close()


def test_requests_wait_for_a_load_on_demand_in_worker_0_without_holding_up_the_others(
    repository: Path,
) -> None:
    server = _start(repository, "--model-load-on-demand")
    try:
        with httpclient.InferenceServerClient(server.http_url) as client:
            client.load_model("counter")
        # slow_sequence (4 s to load) is not loaded: requests from fresh connections load it on
        # demand, in worker 0 for both workers, while counter's requests are answered.
        outcomes: queue.Queue[object] = queue.Queue()

        def sleepy(sequence_id: int) -> None:
            with grpcclient.InferenceServerClient(server.grpc_url) as client:
                x = grpcclient.InferInput("X", [1], "INT32")
                x.set_data_from_numpy(np.array([sequence_id], np.int32))
                result = client.infer("slow_sequence", [x], sequence_id=sequence_id, sequence_start=True,
                                      sequence_end=True, client_timeout=60)  # fmt: skip
                outcomes.put(int(result.as_numpy("Y")[0]))

        threads = [threading.Thread(target=sleepy, args=(sid,)) for sid in range(1, 5)]
        for thread in threads:
            thread.start()
        time.sleep(0.5)  # their requests wait for the load
        started = time.monotonic()
        for step in range(8):
            assert _sequence_step(server, 50 + step, 2, start=True, end=True, grpc=step % 2 == 0) == 2
        quick = time.monotonic() - started
        for thread in threads:
            thread.join(timeout=90)
        assert sorted(outcomes.get_nowait() for _ in range(4)) == [1, 2, 3, 4]
        assert server.log.count("loading model 'slow_sequence' on demand") <= 2  # once in each worker
        assert quick < 3, quick  # not held up by the load
    finally:
        server.close()


def test_a_request_cancelled_in_one_worker_is_cancelled_in_worker_0(server: ServerProcess) -> None:
    """Six one-request sequences of 0.5 s on one sequence slot, each from a channel of its own
    whose deadline passes at 0.3 s: each ends cancelled in worker 0, wherever it arrived
    (without the cancel passed on, those sent on would run in turn and succeed)."""
    with httpclient.InferenceServerClient(server.http_url) as client:
        client.load_model("sleepy_sequence")
    outcomes: list[str] = []
    done = threading.Semaphore(0)

    def finished(result: object, error: InferenceServerException | None) -> None:
        outcomes.append("ok" if error is None else str(error.status()))
        done.release()

    clients = [grpcclient.InferenceServerClient(server.grpc_url) for _ in range(6)]
    try:
        for sequence_id, client in enumerate(clients, start=1):
            x = grpcclient.InferInput("X", [1], "INT32")
            x.set_data_from_numpy(np.array([sequence_id], np.int32))
            client.async_infer("sleepy_sequence", [x], finished, sequence_id=sequence_id,
                               sequence_start=True, sequence_end=True, client_timeout=0.3)  # fmt: skip
        for _ in clients:
            assert done.acquire(timeout=30)
    finally:
        for client in clients:
            client.close()
    assert outcomes == ["StatusCode.DEADLINE_EXCEEDED"] * 6

    def statistics() -> dict[str, Any]:
        with httpclient.InferenceServerClient(server.http_url) as client:
            stats: dict[str, Any] = client.get_inference_statistics("sleepy_sequence")["model_stats"][0]
        return stats

    wait_until(lambda: statistics()["inference_stats"]["fail"]["count"] == 6, "six requests cancelled", 10)
    stats = statistics()
    # (A backlog's next sequence may start in the instant before its own cancel arrives.)
    assert stats["inference_stats"]["success"]["count"] == 0 and stats["execution_count"] < 6, stats
    assert "Traceback" not in server.log


def test_the_responses_of_a_decoupled_model_come_back_from_worker_0_in_order(server: ServerProcess) -> None:
    with httpclient.InferenceServerClient(server.http_url) as client:
        client.load_model("sequence_streamer")
    for sequence_id in range(1, 7):  # a channel each: some arrive at worker 1, some at worker 0
        responses: queue.Queue[Any] = queue.Queue()
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            client.start_stream(lambda result, error, into=responses: into.put(error or result))
            n = grpcclient.InferInput("N", [1], "INT32")
            n.set_data_from_numpy(np.array([20], np.int32))
            client.async_stream_infer("sequence_streamer", [n], sequence_id=sequence_id,
                                      sequence_start=True, sequence_end=True)  # fmt: skip
            values = [int(responses.get(timeout=30).as_numpy("VALUE")[0]) for _ in range(20)]
            client.stop_stream()
        assert values == list(range(20)), sequence_id


GPU_REPORT_CONFIG = """
backend: "gpu_report"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""


def test_gpu_instances_are_counted_per_server_not_per_worker(
    repository: Path, tmp_path: Path, gpu_report_backend_site: Path
) -> None:
    """The `gpu_report` test backend reports two GPUs: a KIND_GPU group of count 2 gets its 4
    instances once, in worker 0, as does a KIND_CPU group that asks for one copy, while a
    KIND_CPU group of count 2 gets 2 in each worker."""
    once = 'parameters { key: "coreserve_single_copy" value { string_value: "%s" } }'
    for name, group, extra in (
        ("on_gpus", "KIND_GPU", ""),
        ("on_cpus", "KIND_CPU", ""),
        ("on_cpus_once", "KIND_CPU", once % "true"),
        ("on_cpus_maybe", "KIND_CPU", once % "maybe"),
    ):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "1" / "model.gpu").write_bytes(b"")
        (tmp_path / name / "config.pbtxt").write_text(
            GPU_REPORT_CONFIG + f"instance_group [ {{ kind: {group} count: 2 }} ]\n{extra}"
        )
    write_model(tmp_path, "add_sub", add_sub_model(), ADD_SUB_CONFIG)
    site = os.pathsep.join([str(gpu_report_backend_site), os.environ.get("PYTHONPATH", "")])
    server = _start(
        tmp_path,
        "--load-model=on_gpus",
        "--load-model=on_cpus",
        "--load-model=on_cpus_once",
        env={"PYTHONPATH": site, "GPU_REPORT_GPUS": "0,1"},
    )
    try:
        placed = re.findall(
            r" (\d+) coreserve\.backend\.gpu_report\] placed (\w+)/(\S+) on (\w+) (\d+)", server.log
        )
        on_gpus = sorted(
            (instance, kind, device) for _, model, instance, kind, device in placed if model == "on_gpus"
        )
        assert on_gpus == [("on_gpus_0_0", "GPU", "0"), ("on_gpus_0_0", "GPU", "1"),
                           ("on_gpus_0_1", "GPU", "0"), ("on_gpus_0_1", "GPU", "1")]  # fmt: skip
        on_gpus_pids = {pid for pid, model, *_ in placed if model == "on_gpus"}
        assert len(on_gpus_pids) == 1
        cpu_pids = [pid for pid, model, *_ in placed if model == "on_cpus"]
        assert len(cpu_pids) == 4 and len(set(cpu_pids)) == 2
        once_pids = [pid for pid, model, *_ in placed if model == "on_cpus_once"]
        assert len(once_pids) == 2 and set(once_pids) == set(on_gpus_pids)
        body = json.dumps(
            {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}
        )
        for model in ("on_gpus", "on_cpus", "on_cpus_once"):
            answers = {
                _request(server, "POST", f"/v2/models/{model}/infer", body) for _ in range(CONNECTIONS // 2)
            }
            assert {(status, tuple(json.loads(text)["outputs"][0]["data"])) for status, text in answers} == {
                (200, (1.0, 2.0))
            }
        with httpclient.InferenceServerClient(server.http_url) as client:
            stats = client.get_inference_statistics("on_gpus")["model_stats"][0]
        assert stats["inference_count"] == CONNECTIONS // 2
        with (
            httpclient.InferenceServerClient(server.http_url) as client,
            pytest.raises(InferenceServerException) as refused,
        ):
            client.load_model("on_cpus_maybe")
        assert (
            "parameter 'coreserve_single_copy' must be true or false, got 'maybe'" in refused.value.message()
        )
        assert "Traceback" not in server.log
    finally:
        server.close()


def _worker_index(pid: int) -> int:
    """Which worker a process is, from the environment it started with."""
    variables = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    role = next(v for v in variables if v.startswith(b"CORESERVE_WORKER="))
    return int(role.split(b"=", 1)[1].split(b"/")[0])


def test_worker_0_that_dies_is_started_again_and_serves_its_models_for_all_again(repository: Path) -> None:
    server = _start(repository)
    try:
        with httpclient.InferenceServerClient(server.http_url) as client:
            client.load_model("counter")
        owner = next(pid for pid in _workers(server) if _worker_index(pid) == 0)
        os.kill(owner, signal.SIGKILL)
        wait_until(lambda: owner not in _workers(server) and len(_workers(server)) == 2, "worker 0 again")
        wait_until(lambda: _status(server, "GET", "/v2/health/ready") == 200, "ready again", timeout=120)
        values = [3, 1, 4, 1, 5, 9, 2, 6]
        sums = [
            _sequence_step(server, 21, value, start=step == 0, end=step == 7, grpc=step % 2 == 0)
            for step, value in enumerate(values)
        ]
        assert sums == list(np.cumsum(values))
        assert {_status(server, "GET", "/v2/models/counter/ready") for _ in range(CONNECTIONS // 2)} == {200}
    finally:
        server.close()


def test_one_triton_trace_file_holds_every_workers_traces(repository: Path, tmp_path: Path) -> None:
    """Worker 0 writes the one trace file; the other worker sends it each trace as it ends,
    numbered apart (worker i of 2: i + 1, i + 3, ...)."""
    trace_file = tmp_path / "trace.json"
    server = _start(repository, "--trace-config", f"triton,file={trace_file}",
                    "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1")  # fmt: skip
    try:
        for index in range(CONNECTIONS // 2):
            body = json.loads(ADD_BODY)
            body["id"] = f"request-{index}"
            assert _request(server, "POST", "/v2/models/add_sub/infer", json.dumps(body))[0] == 200
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


def test_worker_0s_line_answers_a_malformed_request_and_survives_a_broken_frame(
    server: ServerProcess,
) -> None:
    """The line other workers send worker 0 their requests on (a Unix socket in the
    supervisor's private folder): a request frame it cannot run gets an error for that
    request; a frame past the limits ends that line only; the server serves on."""
    with httpclient.InferenceServerClient(server.http_url) as client:
        client.load_model("counter")
    owner = next(pid for pid in _workers(server) if _worker_index(pid) == 0)
    variables = Path(f"/proc/{owner}/environ").read_bytes().split(b"\0")
    supervisor_socket = next(v for v in variables if v.startswith(b"CORESERVE_WORKER=")).split(b"/", 2)[2]
    path = owner_socket(supervisor_socket.decode())
    assert oct(Path(path).parent.stat().st_mode & 0o777) == "0o700"

    async def talk() -> None:
        reader, writer = await asyncio.open_unix_connection(path)
        states = await read_frame(reader)
        assert states is not None and "counter" in states.header["states"]
        writer.writelines(frame({"n": 1, "model": "counter"}))  # no version, inputs, ...
        writer.writelines(frame({"n": 2, "model": "nowhere", "version": 1, "id": "", "parameters": {},
                                 "outputs": None, "batch": 1}, {}))  # fmt: skip
        answers = {}
        while len(answers) < 2:
            answer = await asyncio.wait_for(read_frame(reader), 30)
            assert answer is not None
            answers[answer.header["n"]] = answer.header["error"]
        assert answers[1]["kind"] == "InternalError"
        assert answers[2]["kind"] == "NotFoundError" and "nowhere" in answers[2]["message"]
        writer.write(struct.pack("!IQ", 2**31, 0))  # a header past the limit
        assert await asyncio.wait_for(reader.read(), 30) == b""  # the line ends
        writer.close()

    asyncio.run(talk())
    assert _sequence_step(server, 77, 5, start=True, end=True, grpc=False) == 5
    assert "a worker's line to worker 0 broke: a frame between workers is too large" in server.log


def test_sigterm_stops_every_worker(repository: Path) -> None:
    server = _start(repository, "--exit-timeout-secs=10")
    workers = _workers(server)
    assert server.process is not None
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=60) == 0
    assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()]
    assert server.log.count("coreserve stopped") == 3  # each worker, then the supervisor


def test_a_start_that_fails_stops_the_server(repository: Path, tmp_path: Path) -> None:
    write_model(tmp_path, "broken", b"not an onnx model", SCALE_CONFIG)
    command = [sys.executable, "-m", "coreserve", f"--model-repository={tmp_path}", "--http-thread-count=2",
               f"--http-port={_free_port()}", f"--grpc-port={_free_port()}", "--metrics-port=0"]  # fmt: skip
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
