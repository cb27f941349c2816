"""The models one worker serves for all in a server of several workers: sequence models,
KIND_GPU models and those that ask for one copy are loaded by worker 0 alone; the other workers
send it their requests on a Unix-socket line. A sequence keeps its state whichever worker its
requests reach, a cancel reaches worker 0, a decoupled model's responses come back in order,
readiness agrees, and the line survives malformed frames.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerProcess
from support.model_builders import (
    ACCUMULATOR_SEQUENCE_CONFIG,
    ADD_SUB_CONFIG,
    accumulator_model,
    add_sub_model,
    write_model,
)
from support.servers.worker_servers import (
    CONNECTIONS,
    answer_of,
    sequence_step,
    start_workers,
    status_of,
    worker_index,
    worker_pids,
    write_repository,
)
from support.waiting import requests_in, wait_until

# Triton's refusal of a new sequence once the server stops.
STOPPING = "Server is stopping, scheduler for model has stopped accepting new inference requests"
# Why the other worker refuses a model whose reload failed in worker 0 alone.
WORKER_0_SERVES_ANOTHER = (
    "worker 0, which serves model '%s' for every worker, serves version 1 with other inputs, "
    "outputs, batch size or transaction policy than this worker loaded (a load of this "
    "configuration failed there, or is not done); load the model again once it loads"
)


def _one_step_sequences(server: ServerProcess, model: str) -> tuple[set[int], set[tuple[str, str]]]:
    """A sequence of one step (7) on each of CONNECTIONS connections: the sums answered, and
    the refusals' statuses and messages."""
    served, refusals = set(), set()
    for sequence_id in range(100, 100 + CONNECTIONS):
        try:
            served.add(sequence_step(server, sequence_id, 7, start=True, end=True, grpc=False, model=model))
        except InferenceServerException as refused:
            refusals.add((refused.status(), refused.message()))
    return served, refusals


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_repository(tmp_path_factory.mktemp("workers"))


@pytest.fixture
def server(repository: Path) -> Iterator[ServerProcess]:
    process = start_workers(repository)
    yield process
    process.close()


def test_a_sequence_keeps_its_state_whichever_worker_its_requests_reach(server: ServerProcess) -> None:
    """A sequence model is served by worker 0 for every worker: the others send it their
    requests, so a sequence's running sum holds over requests that reach different workers."""
    with httpclient.InferenceServerClient(server.http_url) as client:
        client.load_model("counter")
    assert {status_of(server, "GET", "/v2/models/counter/ready") for _ in range(CONNECTIONS // 2)} == {200}
    sequences = {7: [1, 2, 3, 4, 5, 6, 7, 8], 8: [10, 20, 30, 40, 50, 60, 70, 80]}
    sums: dict[int, list[int]] = {sid: [] for sid in sequences}
    for step in range(8):  # interleaved, over HTTP and gRPC alternately
        for sid, values in sequences.items():
            last = step == len(values) - 1
            sums[sid].append(
                sequence_step(server, sid, values[step], start=step == 0, end=last, grpc=step % 2 == 1)
            )
    for sid, values in sequences.items():
        assert sums[sid] == list(np.cumsum(values)), sid
    # A request of no started sequence gets worker 0's error, whichever worker it reaches.
    answers = set()
    for _ in range(CONNECTIONS // 4):
        with pytest.raises(InferenceServerException) as refused:
            sequence_step(server, 99, 1, start=False, end=False, grpc=False)
        answers.add((refused.value.status(), refused.value.message()))
    assert len(answers) == 1, answers
    status, message = answers.pop()
    assert status == "400" and "must specify the START flag" in message
    # Counted once, where they ran.
    with httpclient.InferenceServerClient(server.http_url) as client:
        stats = client.get_inference_statistics("counter")["model_stats"][0]
    assert stats["inference_count"] == 16 and stats["inference_stats"]["success"]["count"] == 16
    with httpclient.InferenceServerClient(server.http_url) as client:
        client.unload_model("counter")
    assert {status_of(server, "GET", "/v2/models/counter/ready") for _ in range(CONNECTIONS // 2)} == {400}
    assert "Traceback" not in server.log


def test_a_single_copy_model_mended_and_loaded_again_is_ready_in_every_worker(
    repository: Path, tmp_path: Path
) -> None:
    """Worker 0 told the others that its load failed; their next load of the model is judged
    by worker 0's next word, not that old one. A reload of another configuration that fails in
    worker 0, where the loaded version serves on, is undone in the others: all serve the loaded
    version, and a worker started again takes that on too."""
    write_model(tmp_path, "add_sub", add_sub_model(), ADD_SUB_CONFIG)
    write_model(tmp_path, "mended", b"not an onnx model", ACCUMULATOR_SEQUENCE_CONFIG)
    # (Without auto-completion the configuration is read from the file alone: only worker 0,
    # which loads the model, finds the model file broken.)
    server = start_workers(tmp_path, "--disable-auto-complete-config")
    try:
        with httpclient.InferenceServerClient(server.http_url) as client:
            with pytest.raises(InferenceServerException):
                client.load_model("mended")
            wait_until(  # worker 0 tells the others its model failed
                lambda: {status_of(server, "GET", "/v2/models/mended/ready") for _ in range(10)} == {400},
                "not ready anywhere",
            )
            write_model(tmp_path, "mended", accumulator_model(), ACCUMULATOR_SEQUENCE_CONFIG)
            client.load_model("mended")
        assert {status_of(server, "GET", "/v2/models/mended/ready") for _ in range(CONNECTIONS // 2)} == {200}
        values = [4, 5, 6]
        sums = [
            sequence_step(server, 3, value, start=step == 0, end=step == 2, grpc=False, model="mended")
            for step, value in enumerate(values)
        ]
        assert sums == [4, 9, 15]

        # Another configuration (batches up to 4), and a model file worker 0 cannot load: the
        # reload fails there (the loaded version serves on) and is undone in the other worker,
        # which made it: every worker serves the loaded version, as it did.
        write_model(
            tmp_path,
            "mended",
            b"not an onnx model",
            ACCUMULATOR_SEQUENCE_CONFIG.replace("max_batch_size: 2", "max_batch_size: 4"),
        )
        with (
            httpclient.InferenceServerClient(server.http_url) as client,
            pytest.raises(InferenceServerException, match="the loaded version keeps serving"),
        ):
            client.load_model("mended")
        assert _one_step_sequences(server, "mended") == ({7}, set())
        assert {status_of(server, "GET", "/v2/models/mended/ready") for _ in range(CONNECTIONS // 2)} == {200}
        # The other worker, started again, takes on what worker 0 serves (not the configuration
        # the files hold now): ready, and every request served.
        other = next(pid for pid in worker_pids(server) if worker_index(pid) != 0)
        os.kill(other, signal.SIGKILL)
        wait_until(
            lambda: other not in worker_pids(server) and len(worker_pids(server)) == 2, "started again"
        )
        wait_until(lambda: status_of(server, "GET", "/v2/health/ready") == 200, "ready again", timeout=120)
        assert _one_step_sequences(server, "mended") == ({7}, set())
        write_model(tmp_path, "mended", accumulator_model(), ACCUMULATOR_SEQUENCE_CONFIG)
        with httpclient.InferenceServerClient(server.http_url) as client:
            client.load_model("mended")
        assert {status_of(server, "GET", "/v2/models/mended/ready") for _ in range(CONNECTIONS // 2)} == {200}
        assert {
            sequence_step(server, sid, 2, start=True, end=True, grpc=sid % 2 == 0, model="mended")
            for sid in range(200, 200 + CONNECTIONS // 2)
        } == {2}
        assert "Traceback" not in server.log
    finally:
        server.close()


def test_a_reload_by_poll_that_fails_in_worker_0_alone_leaves_the_others_refusing_the_model(
    tmp_path: Path,
) -> None:
    """Without a change through the repository API (each worker polls the repository itself),
    worker 0's refusal of a request checked for the configuration it failed to load tells the
    other worker: it refuses the model from then on, with the reason, and reports it not ready."""
    write_model(tmp_path, "add_sub", add_sub_model(), ADD_SUB_CONFIG)
    write_model(tmp_path, "polled", accumulator_model(), ACCUMULATOR_SEQUENCE_CONFIG)
    server = start_workers(
        tmp_path, "--model-control-mode=poll", "--repository-poll-secs=1", "--disable-auto-complete-config"
    )
    try:
        assert sequence_step(server, 1, 3, start=True, end=True, grpc=False, model="polled") == 3
        write_model(
            tmp_path,
            "polled",
            b"not an onnx model",
            ACCUMULATOR_SEQUENCE_CONFIG.replace("max_batch_size: 2", "max_batch_size: 4"),
        )
        wait_until(lambda: server.log.count("model 'polled' did not reload") >= 1, "worker 0's reload failed")
        wait_until(
            lambda: server.log.count("model 'polled' version 1 is served by worker 0") >= 2, "reloaded there"
        )
        served, refusals = _one_step_sequences(server, "polled")
        assert served == {7}
        assert refusals, "no request reached the other worker"
        assert all(WORKER_0_SERVES_ANOTHER % "polled" in message for _, message in refusals), refusals
        assert ("404", f"Request for unknown model: 'polled' has no available versions (version 1: "
                f"{WORKER_0_SERVES_ANOTHER % 'polled'})") in refusals  # fmt: skip
        assert {status_of(server, "GET", "/v2/models/polled/ready") for _ in range(CONNECTIONS // 2)} == {
            200,
            400,
        }
        assert "Traceback" not in server.log
    finally:
        server.close()


def test_requests_wait_for_a_load_on_demand_in_worker_0_without_holding_up_the_others(
    repository: Path,
) -> None:
    server = start_workers(repository, "--model-load-on-demand")
    try:
        with httpclient.InferenceServerClient(server.http_url) as client:
            client.load_model("counter")
        # slow_sequence (6 s to load) is not loaded: requests from fresh connections load it on
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
        wait_until(
            lambda: "loading model 'slow_sequence' on demand" in server.log, "the load on demand begun"
        )
        for step in range(8):
            assert sequence_step(server, 50 + step, 2, start=True, end=True, grpc=step % 2 == 0) == 2
        assert outcomes.empty()  # answered while slow_sequence still loads (6 s), not after it
        for thread in threads:
            thread.join(timeout=90)
        assert sorted(outcomes.get_nowait() for _ in range(4)) == [1, 2, 3, 4]
        assert 1 <= server.log.count("loading model 'slow_sequence' on demand") <= 2  # once in each worker
    finally:
        server.close()


def _start_sequences(
    clients: list[grpcclient.InferenceServerClient],
    finished: Callable[[object, InferenceServerException | None], None],
    client_timeout: float,
    after_first: Callable[[], None] = lambda: None,
) -> None:
    """A one-request sequence of `sleepy_sequence` (2 s) on each client, ids from 1;
    `after_first` is called once the first is sent."""
    for sequence_id, client in enumerate(clients, start=1):
        x = grpcclient.InferInput("X", [1], "INT32")
        x.set_data_from_numpy(np.array([sequence_id], np.int32))
        client.async_infer("sleepy_sequence", [x], finished, sequence_id=sequence_id,
                           sequence_start=True, sequence_end=True, client_timeout=client_timeout)  # fmt: skip
        if sequence_id == 1:
            after_first()


def test_a_request_cancelled_in_one_worker_is_cancelled_in_worker_0(server: ServerProcess) -> None:
    """Six one-request sequences of 2 s on one sequence slot, each from a channel of its own
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
        _start_sequences(clients, finished, client_timeout=0.3)
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


def test_worker_0_stopping_serves_the_requests_another_worker_took_from_its_clients(
    server: ServerProcess,
) -> None:
    """A stop reaches the workers one by one: a request that worker 1 took before its own stop
    began was taken by the server, and worker 0, stopping already, serves it (Triton refuses
    only what comes after the stop). Here worker 0 alone is told to stop, while it runs a
    sequence: new sequences that reach worker 1 are served; those that reach worker 0 itself
    are refused in Triton's words."""
    with httpclient.InferenceServerClient(server.http_url) as client:
        client.load_model("sleepy_sequence")
    worker_0 = next(pid for pid in worker_pids(server) if worker_index(pid) == 0)
    outcomes: queue.Queue[str] = queue.Queue()

    def finished(result: object, error: InferenceServerException | None) -> None:
        outcomes.put("ok" if error is None else str(error.message()))

    def stop_worker_0() -> None:  # while it runs the first
        wait_until(lambda: requests_in(server.metrics_url, "sleepy_sequence") == 1, "running")
        os.kill(worker_0, signal.SIGTERM)
        wait_until(lambda: "signal received; stopping" in server.log, "worker 0 stopping")

    clients = [grpcclient.InferenceServerClient(server.grpc_url) for _ in range(13)]
    try:
        _start_sequences(clients, finished, client_timeout=60, after_first=stop_worker_0)
        answers = [outcomes.get(timeout=60) for _ in clients]
    finally:
        for client in clients:
            client.close()
    assert set(answers) <= {"ok", STOPPING}, answers
    # The first, and those worker 1 took (none of 12: 2**-12).
    assert answers.count("ok") >= 2, answers
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
    server = start_workers(
        tmp_path,
        "--load-model=on_gpus",
        "--load-model=on_cpus",
        "--load-model=on_cpus_once",
        env={"PYTHONPATH": site, "GPU_REPORT_GPUS": "0,1"},
    )
    try:
        placed = re.findall(r" (\d+) \S+\] \"placed (\w+)/(\S+) on (\w+) (\d+)\"", server.log)
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
                answer_of(server, "POST", f"/v2/models/{model}/infer", body) for _ in range(CONNECTIONS // 2)
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


def test_worker_0_that_dies_is_started_again_and_serves_its_models_for_all_again(repository: Path) -> None:
    server = start_workers(repository)
    try:
        with httpclient.InferenceServerClient(server.http_url) as client:
            client.load_model("counter")
        owner = next(pid for pid in worker_pids(server) if worker_index(pid) == 0)
        os.kill(owner, signal.SIGKILL)
        wait_until(
            lambda: owner not in worker_pids(server) and len(worker_pids(server)) == 2, "worker 0 again"
        )
        wait_until(lambda: status_of(server, "GET", "/v2/health/ready") == 200, "ready again", timeout=120)
        values = [3, 1, 4, 1, 5, 9, 2, 6]
        sums = [
            sequence_step(server, 21, value, start=step == 0, end=step == 7, grpc=step % 2 == 0)
            for step, value in enumerate(values)
        ]
        assert sums == list(np.cumsum(values))
        assert {status_of(server, "GET", "/v2/models/counter/ready") for _ in range(CONNECTIONS // 2)} == {
            200
        }
    finally:
        server.close()
