"""Canary rollouts run by the server: a healthy candidate promoted step by step, a failing or a
slow one rolled back at the end of the step that shows it, by hand promoted or aborted, and
every mistake in a plan refused."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerFactory, ServerProcess
from support.waiting import wait_until
from support.wire.http_raw import request

from .conftest import write_behaving

ONES = np.ones((1, 4), np.float32)


def _post(server: ServerProcess, path: str, body: object = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else b""
    status, _, answer = request(server.http_url, "POST", f"/v2/repository/models/behaving/{path}", data)
    return status, json.loads(answer)


def _status(server: ServerProcess) -> dict:
    status, _, answer = request(server.http_url, "GET", "/v2/repository/models/behaving/rollout")
    assert status == 200, answer
    return json.loads(answer)


def _weights(server: ServerProcess) -> dict:
    return json.loads(request(server.http_url, "GET", "/v2/repository/models/behaving/traffic")[2])["weights"]


@pytest.fixture
def server(coreserve_server: ServerFactory, tmp_path: Path) -> ServerProcess:
    """behaving: version 1 answers at once; 2 too; 3 fails every request; 4 takes 600 ms (a
    stall of the stable version's would have to last 200 ms to hide it from a 3x guard)."""
    root = write_behaving(
        tmp_path / "models", "behaving", {1: "scale 1", 2: "scale 1", 3: "fail", 4: "sleep 0.6"}
    )
    server = coreserve_server(root)
    assert _post(server, "traffic", {"weights": {"1": 100}})[0] == 200  # version 1 is the stable one
    return server


@pytest.fixture
def load(server: ServerProcess) -> Iterator[None]:
    """Requests that name no version, one after another, while the test runs."""
    stop = threading.Event()

    def send() -> None:
        with httpclient.InferenceServerClient(server.http_url) as client:
            tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
            tensor.set_data_from_numpy(ONES)
            while not stop.is_set():
                with contextlib.suppress(InferenceServerException):  # a failing candidate's answers
                    client.infer("behaving", [tensor])

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    yield
    stop.set()
    sender.join(timeout=30)


def _start(server: ServerProcess, candidate: int, **plan: object) -> dict:
    status, answer = _post(
        server,
        "rollout",
        {"candidate": str(candidate), "steps": [50, 100], "dwell_s": 1.0, "min_requests": 5, **plan},
    )
    assert status == 200, answer
    return answer


def _metrics(server: ServerProcess) -> str:
    with urllib.request.urlopen(server.metrics_url, timeout=30) as answer:
        return answer.read().decode()


def _ended(server: ServerProcess) -> dict:
    return wait_until(lambda: (s := _status(server))["state"] != "RUNNING" and s, "the rollout ended")


def test_a_healthy_candidate_is_promoted_step_by_step(server: ServerProcess, load: None) -> None:
    started = _start(server, 2, max_p99_ratio=1000)
    assert (started["state"], started["stable"], started["step"]) == ("RUNNING", "1", 0)
    # The start is answered once its first step's weights are in place.
    assert [move.split(" ", 1)[1] for move in started["moves"]] == ["step 0: candidate version 2 at 50%"]
    ended = _ended(server)
    assert ended["state"] == "PROMOTED" and ended["step"] == 1, ended
    # (A step is held, and says so, where a stall left the candidate under 5 requests.)
    assert [move.split(" ", 1)[1] for move in ended["moves"] if "held" not in move] == [
        "step 0: candidate version 2 at 50%",
        "step 1: candidate version 2 at 100%",
        "promoted: every step passed its guards; version 2 takes every request",
    ]
    assert _weights(server) == {"2": 100.0}
    assert 'coreserve_traffic_rollout_state{model="behaving",candidate="2",stable="1"} 2' in _metrics(server)
    index = json.loads(request(server.http_url, "POST", "/v2/repository/index", b"{}")[2])
    assert {entry["rollout"] for entry in index if entry["name"] == "behaving"} == {
        "PROMOTED: every step passed its guards"
    }


def test_a_failing_candidate_is_rolled_back_when_its_first_step_ends(
    server: ServerProcess, load: None
) -> None:
    _start(server, 3)
    ended = _ended(server)
    assert ended["state"] == "ROLLED_BACK" and ended["step"] == 0, ended  # judged at the first dwell's end
    assert "candidate error rate 100.00% against 0.00%" in ended["reason"]
    assert _weights(server) == {"1": 100.0}
    # Version 3 took requests only during the step: the step counted each of them, but for the
    # one the load's single sender had in flight when the rollout ended (not judged).
    statistics = json.loads(request(server.http_url, "GET", "/v2/models/behaving/versions/3/stats")[2])
    failed = statistics["model_stats"][0]["inference_stats"]["fail"]["count"]
    window = ended["window"]["candidate"]
    assert window["failures"] == window["requests"] >= 5
    assert failed - window["failures"] in (0, 1)


def _failing_candidate_under(server: ServerProcess, send: Callable[[threading.Event], None]) -> dict:
    """A rollout of the failing version 3 while `send` sends requests until its event is set;
    returns how the rollout ended, after checking that it rolled back on the first step's
    failures, every one counted."""
    stop = threading.Event()
    sender = threading.Thread(target=send, args=(stop,), daemon=True)
    sender.start()
    try:
        _start(server, 3)
        ended = _ended(server)
    finally:
        stop.set()
        sender.join(timeout=30)
    assert ended["state"] == "ROLLED_BACK" and ended["step"] == 0, ended
    window = ended["window"]["candidate"]
    assert window["failures"] == window["requests"] >= 5
    return ended


def test_requests_with_a_stream_of_responses_are_judged_too(server: ServerProcess) -> None:
    """The generate endpoint's requests (DataPlane.stream, as the OpenAI frontend's) count."""
    body = json.dumps({"INPUT0": [1, 1, 1, 1]}).encode()

    def send(stop: threading.Event) -> None:
        while not stop.is_set():
            request(server.http_url, "POST", "/v2/models/behaving/generate", body)

    ended = _failing_candidate_under(server, send)
    assert ended["window"]["stable"]["failures"] == 0 and ended["window"]["stable"]["requests"] >= 1


def test_requests_of_a_grpc_stream_are_judged_too(server: ServerProcess) -> None:
    def send(stop: threading.Event) -> None:
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            client.start_stream(callback=lambda result, error: None)
            tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
            tensor.set_data_from_numpy(ONES)
            while not stop.wait(0.005):
                client.async_stream_infer("behaving", [tensor])
            client.stop_stream()

    _failing_candidate_under(server, send)


def test_a_slow_candidate_is_rolled_back_on_its_p99(server: ServerProcess, load: None) -> None:
    _start(server, 4, max_p99_ratio=3)
    ended = _ended(server)
    assert ended["state"] == "ROLLED_BACK" and ended["step"] == 0, ended
    assert "candidate p99" in ended["reason"] and "(allowed 3x)" in ended["reason"]
    assert _weights(server) == {"1": 100.0}


def test_a_rollout_is_promoted_or_aborted_by_hand(server: ServerProcess) -> None:
    _start(server, 2, dwell_s=3600)
    index = json.loads(request(server.http_url, "POST", "/v2/repository/index", b"{}")[2])
    assert {entry["rollout"] for entry in index if entry["name"] == "behaving"} == {
        "RUNNING: step 0: candidate version 2 at 50%"
    }
    assert _post(server, "traffic", {"weights": {"1": 100}})[0] == 400  # the rollout sets the weights
    status, answer = _post(server, "rollout", {"candidate": "2", "steps": [100], "dwell_s": 1})
    assert (status, "has a rollout running; promote or abort it first" in answer["error"]) == (400, True)
    status, answer = _post(server, "rollout/abort")
    assert (status, answer["state"]) == (200, "ABORTED")
    assert _weights(server) == {"1": 100.0}
    _start(server, 2, dwell_s=3600)
    done = subprocess.run(
        [sys.executable, "-m", "coreserve", "rollout", "promote", "behaving", "--url", server.http_url],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["state"] == "PROMOTED"
    assert _weights(server) == {"2": 100.0}


@pytest.mark.parametrize(
    ("plan", "status", "message"),
    [
        ({"candidate": "2", "steps": [50, 100]}, 400, "a rollout plan needs 'dwell_s'"),
        ({"candidate": "2", "steps": [50, 40, 100], "dwell_s": 1}, 400, "must rise and end at 100"),
        ({"candidate": "2", "steps": [50], "dwell_s": 1}, 400, "must rise and end at 100"),
        (
            {"candidate": "2", "steps": [-5, 100], "dwell_s": 1},
            400,
            "each rollout step must be a number above 0",
        ),
        (
            {"candidate": "2", "steps": [100], "dwell_s": 0},
            400,
            "rollout 'dwell_s' must be a number from 0.1 to",
        ),
        (
            {"candidate": "2", "steps": [100], "dwell_s": 1e-6},
            400,
            "rollout 'dwell_s' must be a number from 0.1",
        ),
        (
            {"candidate": "2", "steps": [100], "dwell_s": 1, "min_requests": 1.5},
            400,
            "rollout 'min_requests' must be a whole number, got 1.5",
        ),
        # The stable version is the one that takes most requests: 1, at 100%.
        ({"candidate": "1", "steps": [100], "dwell_s": 1}, 400, "takes every request already"),
        (
            {"candidate": "x", "steps": [100], "dwell_s": 1},
            400,
            "rollout 'candidate': 'x' is not a version number (>= 0)",
        ),
        ({"candidate": "9", "steps": [100], "dwell_s": 1}, 400, "rollout candidate version 9 of model"),
        (
            {"candidate": "2", "steps": [100], "dwell_s": 1, "speed": 2},
            400,
            "unknown rollout plan field 'speed'",
        ),
        ({"candidate": "2", "steps": "fast", "dwell_s": 1}, 400, "rollout 'steps' must be a list"),
        (
            {"candidate": "2", "steps": [100], "dwell_s": 1, "max_p99_ratio": 0.5},
            400,
            "rollout 'max_p99_ratio' must be a number from 1 to",
        ),
    ],
)
def test_every_mistake_in_a_plan_is_refused(
    server: ServerProcess, plan: dict, status: int, message: str
) -> None:
    got, answer = _post(server, "rollout", plan)
    assert got == status and message in answer["error"], answer
    assert _weights(server) == {"1": 100.0}  # nothing started, nothing changed
    assert "Traceback" not in server.log


def test_the_stable_version_is_never_one_without_weight(server: ServerProcess) -> None:
    assert _post(server, "traffic", {"weights": {"1": 0, "2": 100}})[0] == 200
    status, answer = _post(server, "rollout", {"candidate": "2", "steps": [100], "dwell_s": 1})
    assert (
        status == 400
        and "candidate version 2 of model 'behaving' takes every request already" in answer["error"]
    )
    assert _start(server, 4, dwell_s=3600)["stable"] == "2"
    assert _weights(server) == {"2": 50.0, "4": 50.0}


def test_a_step_held_for_many_dwells_is_one_move(server: ServerProcess) -> None:
    _start(server, 2, dwell_s=0.1, min_requests=1000)
    wait_until(lambda: "dwells)" in _status(server)["moves"][-1], "a step held twice")
    time.sleep(0.5)
    moves = [move.split(" ", 1)[1] for move in _status(server)["moves"]]
    assert moves[:1] == ["step 0: candidate version 2 at 50%"] and len(moves) == 2, moves
    assert moves[1].startswith("step 0: held, the candidate answered too few requests ("), moves
    assert server.log.count("held, the candidate answered too few requests") == 1
    assert _post(server, "rollout/abort")[1]["state"] == "ABORTED"


def test_reading_or_ending_a_rollout_that_never_started_is_not_found(server: ServerProcess) -> None:
    assert request(server.http_url, "GET", "/v2/repository/models/behaving/rollout")[0] == 404
    assert _post(server, "rollout/promote")[0] == 404
    status, answer = _post(server, "rollout/pause")
    assert status == 400 and "no rollout action 'pause'" in answer["error"]


def test_a_rollout_whose_model_is_unloaded_stops_without_a_traceback(
    coreserve_server: ServerFactory, tmp_path: Path
) -> None:
    root = write_behaving(tmp_path / "models", "behaving", {1: "scale 1", 2: "scale 1"})
    server = coreserve_server(root, "--model-control-mode=explicit", "--load-model=behaving")
    assert _post(server, "traffic", {"weights": {"1": 100}})[0] == 200
    _start(server, 2, dwell_s=0.5)
    assert request(server.http_url, "POST", "/v2/repository/models/behaving/unload", b"{}")[0] == 200
    wait_until(lambda: "rollout of model 'behaving' cannot go on" in server.log, "the rollout stopped")
    assert "Traceback" not in server.log
    assert request(server.http_url, "GET", "/v2/repository/models/behaving/rollout")[0] == 404


def _touch(path: Path) -> None:
    """Changes a file's time: a load that changes nothing reloads nothing (as on Triton)."""
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))


def test_a_rollout_whose_model_is_loaded_again_ends_aborted_with_its_last_window(
    coreserve_server: ServerFactory, tmp_path: Path
) -> None:
    root = write_behaving(tmp_path / "models", "behaving", {1: "scale 1", 2: "scale 1"})
    server = coreserve_server(root, "--model-control-mode=explicit", "--load-model=behaving")
    assert _post(server, "traffic", {"weights": {"1": 100}})[0] == 200
    _start(server, 2, dwell_s=0.5, min_requests=1000)  # held at step 0 until the reload ends it
    with httpclient.InferenceServerClient(server.http_url) as client:
        tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(ONES)
        for _ in range(10):
            client.infer("behaving", [tensor])
        _touch(root / "behaving" / "config.pbtxt")
        client.load_model("behaving")  # loaded again: another model, whose policy is its own
    ended = _ended(server)
    assert ended["state"] == "ABORTED" and "was unloaded or loaded again" in ended["reason"], ended
    window = ended["window"]
    assert window["candidate"]["requests"] + window["stable"]["requests"] == 10, ended
    assert "Traceback" not in server.log


def test_a_rollout_whose_model_is_loaded_again_mid_dwell_ends_within_a_second(
    coreserve_server: ServerFactory, tmp_path: Path
) -> None:
    root = write_behaving(tmp_path / "models", "behaving", {1: "scale 1", 2: "scale 1"})
    server = coreserve_server(root, "--model-control-mode=explicit", "--load-model=behaving")
    assert _post(server, "traffic", {"weights": {"1": 100}})[0] == 200
    _start(server, 2, dwell_s=3600)
    _touch(root / "behaving" / "config.pbtxt")
    with httpclient.InferenceServerClient(server.http_url) as client:
        client.load_model("behaving")
    # Nothing asks for the rollout meanwhile: its own task ends it.
    aborted = 'coreserve_traffic_rollout_state{model="behaving",candidate="2",stable="1"} 4'
    wait_until(lambda: aborted in _metrics(server), "the metrics show the rollout aborted", timeout=10)
    status, answer = _post(server, "rollout/abort")
    assert (status, answer["state"]) == (200, "ABORTED") and "was unloaded or loaded again" in answer[
        "reason"
    ]
    assert _weights(server) == {"1": 50.0, "2": 50.0}  # where it stood: set at run time, kept by the reload
    assert "Traceback" not in server.log
