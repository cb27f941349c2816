"""Canary rollouts in a server of several workers: worker 0 runs them on every worker's
requests, and every worker answers for them alike."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from coreserve.testing import ServerProcess
from support.model_builders import ADD_SUB_CONFIG, add_sub_model, write_model
from support.servers.worker_servers import (
    CONNECTIONS,
    answer_of,
    start_workers,
    status_of,
    urlopen_text,
    worker_index,
    worker_pids,
)
from support.waiting import wait_until

from .conftest import INFER_BODY, write_behaving

BASE = "/v2/repository/models/behaving"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    """Two workers; behaving: version 1 answers, 2 too, 3 fails every request; 1 takes all."""
    root = write_behaving(tmp_path / "models", "behaving", {1: "scale 1", 2: "scale 1", 3: "fail"})
    write_model(root, "add_sub", add_sub_model(), ADD_SUB_CONFIG)  # what start_workers loads
    server = start_workers(root, "--load-model=behaving")
    try:
        status, answer = answer_of(server, "POST", f"{BASE}/traffic", json.dumps({"weights": {"1": 100}}))
        assert status == 200, answer
        yield server
        server.stop()
        assert "Traceback" not in server.log
    finally:
        server.close()


@pytest.fixture
def load(server: ServerProcess) -> Iterator[None]:
    """Requests that name no version, one after another, each on a connection of its own (so
    that both workers answer them), while the test runs."""
    stop = threading.Event()

    def send() -> None:
        while not stop.is_set():
            answer_of(server, "POST", "/v2/models/behaving/infer", INFER_BODY)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    yield
    stop.set()
    sender.join(timeout=30)


def _json(server: ServerProcess, method: str, path: str, body: object = None) -> tuple[int, dict]:
    status, answer = answer_of(server, method, path, json.dumps(body) if body is not None else None)
    return status, json.loads(answer)


def _start(server: ServerProcess, candidate: int, dwell_s: float, **guards: object) -> dict:
    plan = {"candidate": str(candidate), "steps": [50, 100], "dwell_s": dwell_s, "min_requests": 10, **guards}
    status, answer = _json(server, "POST", f"{BASE}/rollout", plan)
    assert status == 200, answer
    return answer


def _ended(server: ServerProcess) -> dict:
    return wait_until(
        lambda: (s := _json(server, "GET", f"{BASE}/rollout")[1])["state"] != "RUNNING" and s,
        "the rollout ended",
    )


def test_a_failing_candidate_is_judged_on_every_workers_requests(server: ServerProcess, load: None) -> None:
    _start(server, 3, dwell_s=1.5)
    ended = _ended(server)
    assert ended["state"] == "ROLLED_BACK" and ended["step"] == 0, ended
    assert "candidate error rate 100.00% against 0.00%" in ended["reason"]
    # The step counted the failures of both workers: the statistics (every worker's, added up)
    # count as many, but for the one request the single sender had in flight at the end.
    statistics = _json(server, "GET", "/v2/models/behaving/versions/3/stats")[1]
    failed = statistics["model_stats"][0]["inference_stats"]["fail"]["count"]
    window = ended["window"]["candidate"]
    assert window["failures"] == window["requests"] >= 10
    assert failed - window["failures"] in (0, 1)
    # Every worker answers the same status, index and weights.
    for _ in range(CONNECTIONS):
        assert _json(server, "GET", f"{BASE}/rollout")[1]["moves"] == ended["moves"]
        assert _json(server, "GET", f"{BASE}/traffic")[1]["weights"] == {"1": 100.0}
        index = _json(server, "POST", "/v2/repository/index", {})[1]
        assert {entry.get("rollout") for entry in index if entry["name"] == "behaving"} == {
            f"ROLLED_BACK: {ended['reason']}"
        }


def test_a_healthy_candidate_is_promoted_and_counted_once_in_the_metrics(
    server: ServerProcess, load: None
) -> None:
    _start(server, 2, dwell_s=1.0, max_p99_ratio=1000)  # (latencies on a shared machine vary)
    ended = _ended(server)
    assert ended["state"] == "PROMOTED" and ended["step"] == 1, ended
    assert _json(server, "GET", f"{BASE}/traffic")[1]["weights"] == {"2": 100.0}
    metrics = urlopen_text(server.metrics_url)
    assert 'coreserve_traffic_rollout_state{model="behaving",candidate="2",stable="1"} 2\n' in metrics


def test_while_it_runs_every_worker_refuses_what_would_break_it_and_any_worker_aborts_it(
    server: ServerProcess,
) -> None:
    started = _start(server, 2, dwell_s=600)
    assert started["state"] == "RUNNING"
    for _ in range(CONNECTIONS):  # worker 0's refusals reach the other workers' clients whole
        status, answer = _json(server, "POST", f"{BASE}/rollout", {"candidate": "2", "steps": [10, 100]})
        assert (status, answer["error"]) == (400, "a rollout plan needs 'dwell_s'"), answer
        status, answer = _json(server, "POST", "/v2/repository/models/nothing/rollout/abort")
        assert status == 404 and "nothing" in answer["error"], answer
        status, answer = _json(
            server, "POST", f"{BASE}/rollout", {"candidate": "2", "steps": [100], "dwell_s": 1}
        )
        assert status == 400 and "has a rollout running" in answer["error"], answer
        status, answer = _json(server, "POST", f"{BASE}/traffic", {"weights": {"2": 100}})
        assert status == 400 and "has a rollout running" in answer["error"], answer
        assert _json(server, "GET", f"{BASE}/traffic")[1]["weights"] == {"1": 50.0, "2": 50.0}
    status, answer = _json(server, "POST", f"{BASE}/rollout/abort")
    assert status == 200 and answer["state"] == "ABORTED", answer
    assert _json(server, "GET", f"{BASE}/traffic")[1]["weights"] == {"1": 100.0}
    status, answer = _json(server, "POST", f"{BASE}/rollout/promote")
    assert status == 200 and answer["state"] == "ABORTED"  # an ended rollout stays as it ended


def test_a_rollout_is_gone_with_worker_0_and_the_weights_stay_where_it_left_them(
    server: ServerProcess,
) -> None:
    _start(server, 2, dwell_s=600)
    halves = {"1": 50.0, "2": 50.0}

    def every_worker_has_halves() -> bool:
        return all(
            _json(server, "GET", f"{BASE}/traffic")[1]["weights"] == halves for _ in range(CONNECTIONS)
        )

    wait_until(every_worker_has_halves, "the first step's weights in every worker")
    first = next(pid for pid in worker_pids(server) if worker_index(pid) == 0)
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: first not in worker_pids(server), "worker 0 gone")  # (its socket too)
    # Meanwhile the other worker answers the weights, without the rollout that went with worker 0.
    answers = []

    def restarted() -> bool:
        answers.append(_json(server, "GET", f"{BASE}/traffic"))
        return len(worker_pids(server)) == 2

    wait_until(restarted, "started again")
    wait_until(lambda: status_of(server, "GET", "/v2/health/ready") == 200, "ready", timeout=120)
    assert answers and all(status == 200 and "rollout" not in answer for status, answer in answers), answers
    assert all(answer["weights"] == halves for _, answer in answers), answers
    for _ in range(CONNECTIONS):
        status, answer = _json(server, "GET", f"{BASE}/rollout")
        assert status == 404 and answer["error"] == "model 'behaving' has no rollout", answer
        assert _json(server, "GET", f"{BASE}/traffic")[1]["weights"] == halves
    _start(server, 2, dwell_s=600)  # and it can start again
