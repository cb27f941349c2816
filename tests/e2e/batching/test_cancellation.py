"""Request cancellation, end to end: clients that give up stop the work done for them.

A real server serves Python models (tests/support/servers/cancellation_models): `sleepy` takes 0.5 s per
request on one instance, so 50 requests take 25 s unless the ones whose clients left never
run; `streamer` streams up to 10,000 responses (20 s) unless its response sender says the
request was cancelled. The model's own statistics (execution_count) and the server's metrics
say what ran; the clients are tritonclient, http.client, grpc and raw sockets.
"""

from __future__ import annotations

import http.client
import json
import re
import shutil
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerProcess
from support.paths import CANCELLATION_MODELS
from support.waiting import requests_in, wait_until

MODELS = CANCELLATION_MODELS
CLIENTS = 50
# When the clients give up: halfway through one of sleepy's 0.5 s executions, so that no answer
# is on its way to a client as it gives up (an answer sent as the client left counts as a
# success in the server's statistics and as a failure at the client).
GIVE_UP_S = 1.25
# The most executions of `sleepy` that the 50 requests may cause: the one running when the
# clients give up, those that ran while they were waiting (1.25 s, 0.5 s each), and slack for
# a slow machine. Without cancellation all 50 run.
MOST_EXECUTIONS = 10
INFER_BODY = json.dumps({"inputs": [{"name": "X", "shape": [1], "datatype": "INT32", "data": [7]}]}).encode()
BODIES = {"infer": INFER_BODY, "generate": json.dumps({"X": [7]}).encode()}  # by endpoint


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    shutil.copytree(MODELS, tmp_path, dirs_exist_ok=True)
    (tmp_path / "sleepy_pipeline" / "1").mkdir(exist_ok=True)
    process = ServerProcess([tmp_path])
    try:
        process.start(timeout=120)
        yield process
        log = process.log
    finally:
        process.close()
    # A cancelled request is an ordinary event: never a traceback.
    assert "Traceback" not in log, log


def _statistics(server: ServerProcess, model: str) -> dict:
    with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{model}/stats", timeout=30) as reply:
        return json.loads(reply.read())["model_stats"][0]


def _metric(server: ServerProcess, name: str, **labels: str) -> float:
    """The value of the sample of `name` with exactly these labels (in whatever order)."""
    with urllib.request.urlopen(server.metrics_url, timeout=30) as reply:
        text = reply.read().decode()
    for line in text.splitlines():
        found = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if found and dict(re.findall(r'(\w+)="([^"]*)"', found.group(1))) == labels:
            return float(found.group(2))
    raise AssertionError(f"no {name} sample with labels {labels} in\n{text}")


def _idle(server: ServerProcess, model: str) -> bool:
    return requests_in(server.metrics_url, model) == 0


def _sleepy_serves(server: ServerProcess) -> None:
    """The server still answers: a request to the model that was flooded succeeds."""
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    try:
        x = httpclient.InferInput("X", [1], "INT32")
        x.set_data_from_numpy(np.array([3], np.int32))
        assert client.infer("sleepy", [x]).as_numpy("Y").tolist() == [3]
    finally:
        client.close()


def _post_and_give_up(server: ServerProcess, model: str, timeout: float, endpoint: str = "infer") -> str:
    """POSTs an inference (to `endpoint`: infer or generate) with http.client and gives up
    (closes the socket) after `timeout` s."""
    host, port = server.http_url.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        connection.request(
            "POST", f"/v2/models/{model}/{endpoint}", BODIES[endpoint], {"Content-Type": "application/json"}
        )
        return str(connection.getresponse().status)
    except TimeoutError:
        return "gave up"
    finally:
        connection.close()


def _assert_all_cancelled_but_those_answered(server: ServerProcess, model: str, answered: int) -> None:
    stats = _statistics(server, model)
    failed = stats["inference_stats"]["fail"]["count"]
    assert stats["inference_stats"]["success"]["count"] == answered
    assert failed == CLIENTS - answered
    assert (
        _metric(server, "nv_inference_request_failure", model=model, reason="CANCELED", version="1") == failed
    )


@pytest.mark.parametrize("endpoint", ["infer", "generate"])
def test_http_clients_that_give_up_leave_the_queue(server: ServerProcess, endpoint: str) -> None:
    with ThreadPoolExecutor(CLIENTS) as pool:
        outcomes = list(
            pool.map(lambda _: _post_and_give_up(server, "sleepy", GIVE_UP_S, endpoint), range(CLIENTS))
        )
    wait_until(lambda: _idle(server, "sleepy"), "the queue of sleepy empties", 20)
    executed = _statistics(server, "sleepy")["execution_count"]
    assert executed <= MOST_EXECUTIONS, f"{executed} of {CLIENTS} requests ran after their clients left"
    _assert_all_cancelled_but_those_answered(server, "sleepy", outcomes.count("200"))
    _sleepy_serves(server)


def _grpc_inputs() -> list[grpcclient.InferInput]:
    x = grpcclient.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.array([7], np.int32))
    return [x]


def test_grpc_calls_past_their_deadline_leave_the_queue(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    outcomes: list[str] = []
    done = threading.Semaphore(0)

    def finished(result: object, error: Exception | None) -> None:
        outcomes.append("ok" if error is None else error.status())
        done.release()

    try:
        for _ in range(CLIENTS):
            client.async_infer("sleepy", _grpc_inputs(), finished, client_timeout=GIVE_UP_S)
        for _ in range(CLIENTS):
            assert done.acquire(timeout=60)
    finally:
        client.close()
    assert outcomes.count("StatusCode.DEADLINE_EXCEEDED") >= CLIENTS - MOST_EXECUTIONS
    wait_until(lambda: _idle(server, "sleepy"), "the queue of sleepy empties", 20)
    executed = _statistics(server, "sleepy")["execution_count"]
    assert executed <= MOST_EXECUTIONS, f"{executed} of {CLIENTS} requests ran past their deadline"
    _assert_all_cancelled_but_those_answered(server, "sleepy", outcomes.count("ok"))
    _sleepy_serves(server)


def test_cancelled_grpc_calls_leave_the_queue(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    outcomes: list[str] = []
    done = threading.Semaphore(0)

    def finished(result: object, error: Exception | None) -> None:
        outcomes.append("ok" if error is None else error.status())
        done.release()

    try:
        calls = [client.async_infer("sleepy", _grpc_inputs(), finished) for _ in range(CLIENTS)]
        time.sleep(GIVE_UP_S)
        for call in calls:
            call.cancel()
        for _ in range(CLIENTS):
            assert done.acquire(timeout=60)
    finally:
        client.close()
    wait_until(lambda: _idle(server, "sleepy"), "the queue of sleepy empties", 20)
    executed = _statistics(server, "sleepy")["execution_count"]
    assert executed <= MOST_EXECUTIONS, f"{executed} of {CLIENTS} cancelled requests ran"
    assert outcomes.count("StatusCode.CANCELLED") >= CLIENTS - MOST_EXECUTIONS
    _assert_all_cancelled_but_those_answered(server, "sleepy", outcomes.count("ok"))
    _sleepy_serves(server)


# What the streamer logs when it stops because its response sender says the request was
# cancelled, and how many responses it had sent: anything short of 10,000 (20 s of streaming)
# means it stopped for that reason, not because it was done.
STOPPED = re.compile(
    r"streamer stopped after (\d+) of 10000 responses: cancelled \(request.is_cancelled\(\)=True\)"
)


def _stopped_streamer(server: ServerProcess) -> int:
    """How many responses the streamer had sent when it stopped, cancelled (once it has)."""
    found = wait_until(lambda: STOPPED.search(server.log), "the streamer stops, cancelled")
    return int(found.group(1))


def test_a_grpc_stream_closed_by_its_client_stops_a_decoupled_model(server: ServerProcess) -> None:
    received: list[int] = []
    client = grpcclient.InferenceServerClient(server.grpc_url)
    n = grpcclient.InferInput("N", [1], "INT32")
    n.set_data_from_numpy(np.array([10_000], np.int32))
    client.start_stream(lambda result, error: received.append(0 if error else 1))
    client.async_stream_infer("streamer", [n])
    wait_until(lambda: len(received) >= 20, "the first responses arrive", 30)
    assert STOPPED.search(server.log) is None  # still streaming as its client closes
    client.stop_stream(cancel_requests=True)
    client.close()
    assert _stopped_streamer(server) < 10_000  # stopped by the cancellation, long before its end
    wait_until(lambda: _canceled(server, "streamer") == 1, "the request counts as cancelled")
    _sleepy_serves(server)


def test_an_sse_stream_closed_by_its_client_stops_a_decoupled_model(server: ServerProcess) -> None:
    host, port = server.http_url.split(":")
    body = json.dumps({"N": 10_000}).encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(
            b"POST /v2/models/streamer/generate_stream HTTP/1.1\r\nHost: test\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)
        )
        seen = b""
        while seen.count(b"data: ") < 20:
            chunk = sock.recv(65536)
            assert chunk, seen
            seen += chunk
        assert seen.startswith(b"HTTP/1.1 200 ")
        assert STOPPED.search(server.log) is None  # still streaming as its client closes
    assert _stopped_streamer(server) < 10_000  # stopped by the cancellation, long before its end
    wait_until(lambda: _canceled(server, "streamer") == 1, "the request counts as cancelled")
    _sleepy_serves(server)


def test_cancelling_an_ensemble_request_cancels_its_steps(server: ServerProcess) -> None:
    # The ensemble runs every request at once; their steps queue at sleepy.
    with ThreadPoolExecutor(CLIENTS) as pool:
        outcomes = list(
            pool.map(lambda _: _post_and_give_up(server, "sleepy_pipeline", GIVE_UP_S), range(CLIENTS))
        )
    wait_until(lambda: _idle(server, "sleepy"), "the queue of sleepy empties", 20)
    executed = _statistics(server, "sleepy")["execution_count"]
    assert executed <= MOST_EXECUTIONS, f"{executed} of {CLIENTS} ensemble steps ran after their clients left"
    wait_until(lambda: _idle(server, "sleepy_pipeline"), "the ensemble's requests end", 20)
    _assert_all_cancelled_but_those_answered(server, "sleepy_pipeline", outcomes.count("200"))
    _sleepy_serves(server)


def test_cancelling_a_python_model_request_cancels_its_bls_calls(server: ServerProcess) -> None:
    # bls_parent calls sleepy five times in a row (2.5 s); its client gives up after 0.7 s,
    # while the second call runs.
    assert _post_and_give_up(server, "bls_parent", 0.7) == "gave up"
    wait_until(lambda: _statistics(server, "bls_parent")["execution_count"] == 1, "bls_parent ends", 20)
    sleepy = _statistics(server, "sleepy")
    # The call that was running stopped (sleepy checks is_cancelled()); the later ones were
    # refused before they reached it.
    assert sleepy["execution_count"] <= 2
    assert sleepy["inference_stats"]["fail"]["count"] == 5 - sleepy["inference_stats"]["success"]["count"]
    assert (
        _metric(server, "nv_inference_request_failure", model="bls_parent", reason="CANCELED", version="1")
        == 1
    )
    _sleepy_serves(server)


class SequenceCalls:
    """gRPC calls to sleepy_sequence (X = the sequence id), each outcome ("ok" or its status)
    collected in `outcomes`."""

    def __init__(self, server: ServerProcess) -> None:
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.outcomes: list[str] = []
        self._done = threading.Semaphore(0)

    def send(self, sequence_id: int, timeout: float | None = None, **flags: bool) -> Any:
        """Starts a call; returns its context (`cancel()`)."""

        def finished(result: object, error: Exception | None) -> None:
            self.outcomes.append("ok" if error is None else error.status())  # type: ignore[attr-defined]
            self._done.release()

        return self.client.async_infer(
            "sleepy_sequence",
            [self._x(sequence_id)],
            finished,
            sequence_id=sequence_id,
            client_timeout=timeout,
            **flags,
        )

    def wait(self, count: int) -> list[str]:
        """Waits until `count` more calls ended; returns every outcome so far."""
        for _ in range(count):
            assert self._done.acquire(timeout=60)
        return self.outcomes

    def serves(self, sequence_id: int) -> None:
        """A whole sequence of one request runs and answers."""
        result = self.client.infer(
            "sleepy_sequence",
            [self._x(sequence_id)],
            sequence_id=sequence_id,
            sequence_start=True,
            sequence_end=True,
        )
        assert result.as_numpy("Y").tolist() == [sequence_id]

    @staticmethod
    def _x(value: int) -> grpcclient.InferInput:
        x = grpcclient.InferInput("X", [1], "INT32")
        x.set_data_from_numpy(np.array([value], np.int32))
        return x


@pytest.fixture
def sequence_calls(server: ServerProcess) -> Iterator[SequenceCalls]:
    calls = SequenceCalls(server)
    yield calls
    calls.client.close()


def _canceled(server: ServerProcess, model: str) -> float:
    return _metric(server, "nv_inference_request_failure", model=model, reason="CANCELED", version="1")


def test_cancelled_requests_of_a_sequence_leave_it_with_its_pending_requests(
    server: ServerProcess, sequence_calls: SequenceCalls
) -> None:
    # Sequence 1 starts, then its next requests queue behind one another (0.5 s each); their
    # clients give up after a second. As on Triton, the first one cancelled takes every
    # pending request of its sequence with it, and the sequence is released.
    sequence_calls.send(1, sequence_start=True)
    wait_until(lambda: not _idle(server, "sleepy_sequence"), "sequence 1 starts", 20)  # (RPCs race)
    for _ in range(CLIENTS - 1):
        sequence_calls.send(1, timeout=1.0)
    outcomes = sequence_calls.wait(CLIENTS)
    wait_until(lambda: _idle(server, "sleepy_sequence"), "sleepy_sequence has nothing queued", 20)
    stats = _statistics(server, "sleepy_sequence")
    answered = outcomes.count("ok")
    # Those that ran before the first client gave up, and the one running then (it stops).
    assert answered <= stats["execution_count"] <= 4, outcomes
    assert stats["inference_stats"]["success"]["count"] == answered
    assert stats["inference_stats"]["fail"]["count"] == CLIENTS - answered
    assert _canceled(server, "sleepy_sequence") == CLIENTS - answered
    # The sequence was released: it must start again, and then it runs from a fresh start.
    with pytest.raises(
        InferenceServerException, match=r"must specify the START flag.*a request of it was cancelled"
    ):
        sequence_calls.client.infer("sleepy_sequence", [SequenceCalls._x(1)], sequence_id=1)
    sequence_calls.serves(1)


def test_cancelling_the_running_request_of_a_sequence_cancels_its_waiting_ones(
    server: ServerProcess, sequence_calls: SequenceCalls
) -> None:
    running = sequence_calls.send(1, sequence_start=True)
    wait_until(lambda: not _idle(server, "sleepy_sequence"), "sequence 1 starts", 20)
    waiting = 5
    for _ in range(waiting):
        sequence_calls.send(1)
    wait_until(lambda: requests_in(server.metrics_url, "sleepy_sequence") == 1 + waiting, "they wait", 20)
    # As on Triton, the pending count holds those waiting, not the one executing.
    gauges = ("nv_inference_pending_request_count", "coreserve_inference_executing_request_count")
    assert [_metric(server, name, model="sleepy_sequence", version="1") for name in gauges] == [waiting, 1]
    running.cancel()  # sleepy sees is_cancelled() and stops; its sequence's waiting requests go
    outcomes = sequence_calls.wait(1 + waiting)
    assert outcomes.count("StatusCode.CANCELLED") == 1 + waiting, outcomes
    wait_until(lambda: _idle(server, "sleepy_sequence"), "sleepy_sequence has nothing queued", 20)
    assert _statistics(server, "sleepy_sequence")["execution_count"] == 1
    assert _canceled(server, "sleepy_sequence") == 1 + waiting
    sequence_calls.serves(1)


def test_sequences_cancelled_while_waiting_for_a_slot_never_run(
    server: ServerProcess, sequence_calls: SequenceCalls
) -> None:
    # Sequence 1 takes the only slot and keeps it; 20 sequences wait in the backlog for it
    # and their clients give up.
    sequence_calls.send(1, sequence_start=True)
    assert sequence_calls.wait(1) == ["ok"]
    waiting = range(100, 120)
    for sequence_id in waiting:
        sequence_calls.send(sequence_id, timeout=1.0, sequence_start=True)
    assert sequence_calls.wait(len(waiting)).count("ok") == 1
    # Sequence 1 ends and frees the slot: none of the cancelled sequences takes it.
    sequence_calls.send(1, sequence_end=True)
    assert sequence_calls.wait(1).count("ok") == 2
    wait_until(lambda: _idle(server, "sleepy_sequence"), "sleepy_sequence has nothing queued", 20)
    assert _statistics(server, "sleepy_sequence")["execution_count"] == 2
    assert _canceled(server, "sleepy_sequence") == len(waiting)
    # A cancelled sequence can start again, and the slot serves it.
    sequence_calls.serves(100)
    assert _statistics(server, "sleepy_sequence")["execution_count"] == 3


def test_a_decoupled_request_cancelled_after_execute_returned_counts_as_cancelled(
    server: ServerProcess,
) -> None:
    # background_streamer's execute() returns at once; a thread of its own streams, and goes on
    # sending a few responses after it sees the cancellation, then the final flag.
    received: list[int] = []
    client = grpcclient.InferenceServerClient(server.grpc_url)
    n = grpcclient.InferInput("N", [1], "INT32")
    n.set_data_from_numpy(np.array([10_000], np.int32))
    client.start_stream(lambda result, error: received.append(0 if error else 1))
    client.async_stream_infer("background_streamer", [n])
    wait_until(lambda: len(received) >= 20, "the first responses arrive", 30)
    assert _statistics(server, "background_streamer")["execution_count"] == 1
    client.stop_stream(cancel_requests=True)
    client.close()
    ended = re.compile(r"background streamer ended after (\d+) of 10000 responses")
    found = wait_until(lambda: ended.search(server.log), "the model's thread ends")
    assert int(found.group(1)) < 10_000  # it saw the cancellation long before its end (20 s)
    stats = _statistics(server, "background_streamer")
    assert stats["inference_stats"]["success"]["count"] == 0
    assert stats["inference_stats"]["fail"]["count"] == 1
    assert _canceled(server, "background_streamer") == 1
    assert _metric(server, "nv_inference_request_success", model="background_streamer", version="1") == 0
    # The responses it sent after the cancellation were dropped without a fuss (the fixture
    # checks the log has no traceback), and the server serves on.
    _sleepy_serves(server)
