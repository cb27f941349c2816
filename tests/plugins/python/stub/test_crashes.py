"""A Python model whose stub crashes costs only the crashing request (issue 34).

A real server, a real model.py that calls os._exit(1) on a marked input, and clients that keep
other requests coming: the requests handed to the stub behind the crashing one (pipeline_depth)
go back to the queue and are answered by the restarted stub; the crashing one fails with
Triton's words and status (HTTP 500, gRPC INTERNAL: what Triton 2.51 answers when its stub
dies). While the only instance restarts, the model says not ready and requests wait in its
queue until the restart is over or their deadline passes. Counts and answers, not timings.
"""

from __future__ import annotations

import queue
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerFactory, ServerProcess

CRASH = -1.0  # the marked input: model.py calls os._exit(1)
MODEL = """
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        # Every start but the first takes RESTART_S: a slow initialize() on a restart.
        marker = os.path.join(args["model_repository"], "started")
        if os.path.exists(marker):
            time.sleep(RESTART_S)
        open(marker, "w").close()

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if x[0] == CRASH:
                os._exit(1)
            time.sleep(0.002)  # long enough that the clients' next requests wait behind it
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x * 2)]))
        return responses
"""
CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
# A decoupled model: two responses per request, and a crash after the first for the marked one.
DECOUPLED_MODEL = """
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
            if x[0] == CRASH:
                os._exit(1)
            sender.send(
                pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x * 2)]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
        return None
"""
DECOUPLED_CONFIG = CONFIG + "model_transaction_policy { decoupled: true }\n"


def _model(root: Path, name: str, restart_s: float = 0.0, *, decoupled: bool = False) -> None:
    (root / name / "1").mkdir(parents=True)
    source = (DECOUPLED_MODEL if decoupled else MODEL).replace("RESTART_S", str(restart_s))
    (root / name / "1" / "model.py").write_text(source.replace("CRASH", str(CRASH)))
    (root / name / "config.pbtxt").write_text(DECOUPLED_CONFIG if decoupled else CONFIG)


def _http(server: ServerProcess, model: str, value: float) -> tuple[str, str]:
    """('ok', '') with the right answer, else (the error's status, its message)."""
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    tensor = httpclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.array([value], np.float32))
    try:
        result = client.infer(model, [tensor])
    except InferenceServerException as exc:
        return str(exc.status()), exc.message()
    finally:
        client.close()
    return ("ok", "") if result.as_numpy("OUTPUT0").tolist() == [value * 2] else ("wrong", "")


def _grpc(server: ServerProcess, model: str, value: float, deadline_s: float = 120) -> tuple[str, str]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.array([value], np.float32))
    try:
        result = client.infer(model, [tensor], client_timeout=deadline_s)
    except InferenceServerException as exc:
        return str(exc.status()), exc.message()
    finally:
        client.close()
    return ("ok", "") if result.as_numpy("OUTPUT0").tolist() == [value * 2] else ("wrong", "")


def _wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.05)


def _success_and_fail_counts(server: ServerProcess, model: str) -> tuple[int, int]:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        stats = client.get_inference_statistics(model)["model_stats"][0]["inference_stats"]
    finally:
        client.close()
    return int(stats["success"]["count"]), int(stats["fail"]["count"])


def test_only_the_crashing_requests_fail_under_load(coreserve_server: ServerFactory, tmp_path: Path) -> None:
    _model(tmp_path, "crashy")
    server = coreserve_server(tmp_path)
    clients, per_client, crash_every = 8, 40, 10

    def client_loop(index: int) -> list[tuple[bool, tuple[str, str]]]:
        call = _grpc if index % 2 else _http
        outcomes = []
        for number in range(1, per_client + 1):
            crash = number % crash_every == 0
            outcomes.append((crash, call(server, "crashy", CRASH if crash else float(100 * index + number))))
        return outcomes

    with ThreadPoolExecutor(clients) as pool:
        outcomes = [outcome for batch in pool.map(client_loop, range(clients)) for outcome in batch]
    good = Counter(status for crash, (status, _) in outcomes if not crash)
    crashing = Counter(status for crash, (status, _) in outcomes if crash)
    crashes = clients * (per_client // crash_every)
    # Every good request was answered, and right; each crashing one failed, with one status per protocol.
    assert good == {"ok": clients * per_client - crashes}
    assert crashing == {"500": crashes // 2, "StatusCode.INTERNAL": crashes // 2}
    messages = {message for crash, (_, message) in outcomes if crash}
    assert messages == {
        "Stub process 'crashy_0_0' is not healthy. It exited unexpectedly (with code 1) while serving "
        "this request; it is being restarted."
    }
    log = server.log
    assert log.count("exited unexpectedly (with code 1)") == crashes
    # Some crashes left requests waiting in the stub behind them: they were queued again.
    requeued = [
        int(line.split("the ")[-1].split()[0]) for line in log.splitlines() if "it had not started" in line
    ]
    assert len(requeued) == crashes and sum(requeued) > 0, log
    # Each request counts once in the statistics: a handed-back one is no execution of its own.
    assert _success_and_fail_counts(server, "crashy") == (clients * per_client - crashes, crashes)
    assert "Traceback" not in log


def test_while_the_only_stub_restarts_the_model_is_not_ready_and_requests_wait(
    coreserve_server: ServerFactory, tmp_path: Path
) -> None:
    restart_s = 4.0
    _model(tmp_path, "slow", restart_s)
    server = coreserve_server(tmp_path)
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        assert _http(server, "slow", 1.0) == ("ok", "")
        assert http.is_model_ready("slow") and grpc.is_model_ready("slow")
        status, _ = _http(server, "slow", CRASH)
        assert status == "500"
        # From the crash on (its answer comes after), until the restart's initialize() ends.
        assert not http.is_model_ready("slow") and not grpc.is_model_ready("slow")
        assert not http.is_server_ready()
        # The repository index says READY, as Triton's does (it has no state for a restart).
        assert [entry["state"] for entry in http.get_model_repository_index()] == ["READY"]
        with ThreadPoolExecutor(6) as pool:
            waiting = [pool.submit(_http, server, "slow", float(n)) for n in range(4)]
            # A deadline that passes during the restart: the request leaves the queue.
            hurried = [pool.submit(_grpc, server, "slow", 5.0, restart_s / 8) for _ in range(2)]
            assert [future.result()[0] for future in hurried] == ["StatusCode.DEADLINE_EXCEEDED"] * 2
            assert not http.is_model_ready("slow")  # (the restart is still under way)
            assert [future.result() for future in waiting] == [("ok", "")] * 4
        assert http.is_model_ready("slow") and grpc.is_model_ready("slow") and http.is_server_ready()
    finally:
        http.close()
        grpc.close()
    # The hurried requests never ran: the warm-up and the four that waited did.
    assert _success_and_fail_counts(server, "slow")[0] == 5
    log = server.log
    assert "the stub was restarted" in log and "Traceback" not in log


def test_a_decoupled_request_that_had_answered_fails_and_those_behind_it_are_served(
    coreserve_server: ServerFactory, tmp_path: Path
) -> None:
    _model(tmp_path, "streaming", decoupled=True)
    server = coreserve_server(tmp_path)
    events: queue.SimpleQueue[tuple[str, str]] = queue.SimpleQueue()

    def collect(result: grpcclient.InferResult | None, error: InferenceServerException | None) -> None:
        if error is not None:
            events.put(("error", error.message()))  # (a stream's error carries no status)
        else:
            assert result is not None
            request_id = result.get_response().id
            events.put((request_id, str(result.as_numpy("OUTPUT0").tolist())))

    client = grpcclient.InferenceServerClient(server.grpc_url)
    values = {"crash": CRASH, **{f"r{n}": float(n) for n in range(1, 6)}}
    try:
        client.start_stream(callback=collect)
        for request_id, value in values.items():
            tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
            tensor.set_data_from_numpy(np.array([value], np.float32))
            client.async_stream_infer("streaming", [tensor], request_id=request_id)
        received: list[tuple[str, str]] = []
        deadline = time.monotonic() + 60
        while len(received) < 2 * len(values):  # (queue.Empty past the deadline)
            received.append(events.get(timeout=max(0.1, deadline - time.monotonic())))
    finally:
        client.stop_stream()
        client.close()
    # The crashing request had sent its first response: it is not run again, it fails.
    assert received.count(("crash", "[-1.0]")) == 1
    assert [event for event in received if event[0] == "error"] == [
        (
            "error",
            "Stub process 'streaming_0_0' is not healthy. It exited unexpectedly "
            "(with code 1) while serving this request; it is being restarted.",
        )
    ]
    for n in range(1, 6):  # the others, both responses each, once
        assert [event for event in received if event[0] == f"r{n}"] == [
            (f"r{n}", f"[{float(n)}]"),
            (f"r{n}", f"[{2.0 * n}]"),
        ]
    assert "Traceback" not in server.log
