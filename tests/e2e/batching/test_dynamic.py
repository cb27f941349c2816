"""The dynamic batcher: merging, preferred sizes, shapes, priorities, queue policies, ordering."""

from __future__ import annotations

import json
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerFactory, ServerProcess
from support.model_builders import add_sub_model, write_model
from support.waiting import requests_in, wait_until

ADD_SUB = """
backend: "onnxruntime"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {dims} ] }}, {{ name: "INPUT1" data_type: TYPE_FP32 dims: [ {dims} ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {dims} ] }}, {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ {dims} ] }} ]
dynamic_batching {{ {batching} }}
"""
ECHO = """
backend: "echo"
max_batch_size: {max_batch}
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: {count} }} ]
parameters {{ key: "delay_ms" value: {{ string_value: "{delay}" }} }}
dynamic_batching {{ {batching} }}
"""


def _env(site: Path) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}


def _add_sub(server: ServerProcess, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        inputs = [
            httpclient.InferInput("INPUT0", list(a.shape), "FP32"),
            httpclient.InferInput("INPUT1", list(a.shape), "FP32"),
        ]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(np.ones_like(a))
        result = client.infer("add_sub", inputs)
        return result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")
    finally:
        client.close()


def _echo(
    server: ServerProcess, value: int, priority: int = 0, timeout: int | None = None, **parameters: object
) -> int:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    try:
        tensor = httpclient.InferInput("IN", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[value]], np.int32))
        result = client.infer(
            "echo", [tensor], priority=priority, timeout=timeout, parameters=parameters or None
        )
        return int(result.as_numpy("OUT")[0, 0])
    finally:
        client.close()


def _statistics(server: ServerProcess, model: str) -> dict:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        return client.get_inference_statistics(model)["model_stats"][0]
    finally:
        client.close()


def _concurrently(calls: list[Callable[[], object]]) -> list[object]:
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(call) for call in calls]
        return [future.result(timeout=60) for future in futures]


def test_concurrent_requests_are_merged_and_get_their_own_rows(
    coreserve_server: ServerFactory, tmp_path: Path
) -> None:
    write_model(
        tmp_path,
        "add_sub",
        add_sub_model("FP32", ["batch", 4]),
        ADD_SUB.format(dims="4", batching="max_queue_delay_microseconds: 300000"),
    )
    server = coreserve_server(tmp_path)
    rows = [np.full((1 + index % 2, 4), index, np.float32) for index in range(8)]  # 12 rows in all
    results = _concurrently([lambda a=a: _add_sub(server, a) for a in rows])
    for a, (total, difference) in zip(rows, results, strict=True):
        np.testing.assert_array_equal(total, a + 1)
        np.testing.assert_array_equal(difference, a - 1)
    stats = _statistics(server, "add_sub")
    assert stats["inference_count"] == 12
    assert stats["execution_count"] < 8  # merged: fewer executions than requests
    assert sum(entry["compute_infer"]["count"] for entry in stats["batch_stats"]) == stats["execution_count"]
    assert max(entry["batch_size"] for entry in stats["batch_stats"]) > 2
    assert stats["inference_stats"]["queue"]["ns"] > 0


def test_preferred_batch_size_is_sent_without_waiting(
    coreserve_server: ServerFactory, tmp_path: Path
) -> None:
    write_model(
        tmp_path,
        "add_sub",
        add_sub_model("FP32", ["batch", 4]),
        ADD_SUB.format(
            dims="4", batching="preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 3600000000"
        ),
    )
    server = coreserve_server(tmp_path)
    # The answers come at all: waiting the queue delay (an hour) would hold them past every
    # timeout of the test.
    results = _concurrently([lambda i=i: _add_sub(server, np.full((1, 4), i, np.float32)) for i in range(4)])
    assert [float(total[0, 0]) for total, _ in results] == [1.0, 2.0, 3.0, 4.0]
    assert [entry["batch_size"] for entry in _statistics(server, "add_sub")["batch_stats"]] == [4]


def test_requests_of_different_shapes_are_batched_separately(
    coreserve_server: ServerFactory, tmp_path: Path
) -> None:
    write_model(
        tmp_path,
        "add_sub",
        add_sub_model("FP32", ["batch", "n"]),
        ADD_SUB.format(dims="-1", batching="max_queue_delay_microseconds: 200000"),
    )
    server = coreserve_server(tmp_path)
    rows = [np.full((1, 2 + index % 3), index, np.float32) for index in range(9)]
    results = _concurrently([lambda a=a: _add_sub(server, a) for a in rows])
    for a, (total, _) in zip(rows, results, strict=True):
        np.testing.assert_array_equal(total, a + 1)
    stats = _statistics(server, "add_sub")
    assert stats["inference_count"] == 9 and stats["execution_count"] >= 3


def _echo_server(
    coreserve_server: ServerFactory,
    tmp_path: Path,
    site: Path,
    batching: str,
    *,
    delay: int = 0,
    count: int = 1,
    max_batch: int = 1,
) -> ServerProcess:
    write_model(
        tmp_path,
        "echo",
        b"",
        ECHO.format(batching=batching, delay=delay, count=count, max_batch=max_batch),
        filename="model.echo",
    )
    return coreserve_server(tmp_path, env=_env(site))


def _run_in_order(server: ServerProcess, calls: list[Callable[[], object]]) -> tuple[list[object], list[int]]:
    """Starts calls one after another, each once the server holds the one before (its pending
    count says so) or has answered it; returns results and the order in which they finished."""
    finished: list[int] = []
    lock = threading.Lock()

    def run(index: int, call: Callable[[], object]) -> object:
        try:
            return call()
        except InferenceServerException as exc:
            return exc
        finally:
            with lock:
                finished.append(index)

    with ThreadPoolExecutor(len(calls)) as pool:
        futures: list[Future[object]] = []
        for index, call in enumerate(calls):
            future = pool.submit(run, index, call)
            futures.append(future)
            held = sum(not earlier.done() for earlier in futures)
            wait_until(
                lambda future=future, held=held: (
                    future.done() or requests_in(server.metrics_url, "echo") >= held
                ),
                f"the server holds call {index}",
            )
        # The scenario needs the first call still executing when the last came in.
        assert not futures[0].done(), "the first call ended before the others were queued: slow machine?"
        results = [future.result(timeout=60) for future in futures]
    return results, finished


def test_priorities_reorder_a_backlog(
    coreserve_server: ServerFactory, tmp_path: Path, echo_backend_site: Path
) -> None:
    server = _echo_server(
        coreserve_server,
        tmp_path,
        echo_backend_site,
        "priority_levels: 2 default_priority_level: 2",
        delay=600,
    )
    calls = [
        lambda: _echo(server, 0, delay_ms=3000),  # occupies the instance while the others come
        lambda: _echo(server, 1),
        lambda: _echo(server, 2),
        lambda: _echo(server, 3, priority=1),  # arrives last, runs next
    ]
    results, finished = _run_in_order(server, calls)
    assert results == [0, 1, 2, 3]
    assert finished.index(3) < finished.index(1) and finished.index(3) < finished.index(2)
    # Beyond the model's levels: its default level, as Triton (InferenceRequest::SetPriority).
    assert _echo(server, 4, priority=3) == 4


def test_full_queue_rejects_with_503(
    coreserve_server: ServerFactory, tmp_path: Path, echo_backend_site: Path
) -> None:
    server = _echo_server(
        coreserve_server, tmp_path, echo_backend_site, "default_queue_policy { max_queue_size: 2 }", delay=500
    )
    calls = [lambda: _echo(server, 0, delay_ms=3000), *(lambda v=v: _echo(server, v) for v in range(1, 4))]
    results, _ = _run_in_order(server, calls)  # (the first runs while the others come)
    assert results[:3] == [0, 1, 2]
    assert isinstance(results[3], InferenceServerException)
    assert results[3].status() == "503" and "queue of priority level 1 is full" in results[3].message()
    # Triton's words first (its PriorityQueue's), with the request's id as Triton puts it.
    assert results[3].message().startswith("[request id: <id_unknown>] Exceeds maximum queue size: ")
    assert _echo(server, 9) == 9  # the server keeps serving
    stats = _statistics(server, "echo")  # as Triton, the refused request is not a failure
    assert stats["inference_stats"]["fail"]["count"] == 0
    assert stats["inference_stats"]["success"]["count"] == 4


def _generate_stream(server: ServerProcess, value: int) -> tuple[int, str, bytes]:
    """A generate_stream call: its status, content type and body, whatever the status."""
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/echo/generate_stream",
        data=json.dumps({"IN": value}).encode(),
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, answer.headers["Content-Type"], answer.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.headers["Content-Type"], error.read()


def test_a_stream_refused_by_a_full_queue_gets_a_json_error(
    coreserve_server: ServerFactory, tmp_path: Path, echo_backend_site: Path
) -> None:
    """Refused at the queue's door, a generate_stream request was never queued: Triton answers
    it as any refusal before the model, with a JSON error, not a stream with an error event."""
    server = _echo_server(
        coreserve_server, tmp_path, echo_backend_site, "default_queue_policy { max_queue_size: 1 }", delay=500
    )
    results, _ = _run_in_order(
        server,
        [
            lambda: _echo(server, 0, delay_ms=3000),
            lambda: _echo(server, 1),
            lambda: _generate_stream(server, 2),
        ],
    )
    assert results[:2] == [0, 1]
    status, content_type, body = results[2]  # type: ignore[misc]
    assert (status, content_type) == (503, "application/json")
    assert "Exceeds maximum queue size" in json.loads(body)["error"]
    assert _generate_stream(server, 3)[:2] == (200, "text/event-stream; charset=utf-8")  # still served


def test_timeouts_reject_or_delay(
    coreserve_server: ServerFactory, tmp_path: Path, echo_backend_site: Path
) -> None:
    # Level 2 (the default) rejects after 150 ms, level 1 delays instead, level 3 waits a
    # minute unless a request shortens it. Every request below queues behind one that runs
    # for seconds, and each is sent once the server holds the one before: the timeouts expire
    # on the server's clock while the first still runs, so outcomes do not depend on how
    # quickly this machine sends them.
    batching = (
        "priority_levels: 3 default_priority_level: 2 "
        "default_queue_policy { default_timeout_microseconds: 150000 allow_timeout_override: true } "
        "priority_queue_policy { key: 1 value { default_timeout_microseconds: 150000 timeout_action: DELAY } } "
        "priority_queue_policy { key: 3 value { default_timeout_microseconds: 60000000 allow_timeout_override: true } }"
    )
    server = _echo_server(coreserve_server, tmp_path, echo_backend_site, batching)
    pending = partial(requests_in, server.metrics_url, "echo")
    with ThreadPoolExecutor(5) as pool:
        first = pool.submit(_echo, server, 0, delay_ms=3000)  # executes at once, for seconds
        wait_until(lambda: pending() == 1, "the first request is in")
        delayed = pool.submit(_echo, server, 2, priority=1)  # times out, but DELAY keeps it queued
        wait_until(lambda: pending() == 2, "the request at level 1 is queued")
        rejected = pool.submit(_echo, server, 1)  # times out after 150 ms: rejected
        wait_until(rejected.done, "the request at level 2 is rejected")
        # Level 1's request came first, with the same timeout: it has timed out too, yet waits.
        assert pending() == 2 and not delayed.done()
        waits = pool.submit(_echo, server, 3, priority=3)  # a minute's timeout: still waits
        wait_until(lambda: pending() == 3, "the request at level 3 is queued")
        shortened = pool.submit(_echo, server, 6, priority=3, timeout=1000)  # its own 1 ms
        wait_until(shortened.done, "the request that shortened its timeout is rejected")
        assert not first.done(), "the first request ended before the others timed out: slow machine?"
        assert (first.result(timeout=60), delayed.result(timeout=60), waits.result(timeout=60)) == (0, 2, 3)
    for refused in (rejected, shortened):
        error = refused.exception()
        assert isinstance(error, InferenceServerException)
        assert error.status() == "503" and error.message().startswith("Request timeout expired")
    stats = _statistics(server, "echo")
    assert stats["inference_stats"]["fail"]["count"] == 2
    assert stats["inference_stats"]["success"]["count"] == 3


@pytest.mark.parametrize("preserve", [False, True])
def test_preserve_ordering(
    coreserve_server: ServerFactory, tmp_path: Path, echo_backend_site: Path, preserve: bool
) -> None:
    server = _echo_server(
        coreserve_server, tmp_path, echo_backend_site, f"preserve_ordering: {str(preserve).lower()}", count=2
    )

    # The first request runs two seconds on one instance; the second, sent while it runs, runs
    # at once on the other. Without preserve_ordering its answer comes while the first still
    # runs; with it, its answer is held until the first's has left. Asserted on what the server
    # reports (the second's execution counted) and which answers had come, not on how long
    # the second one took. tests/core/scheduling/test_ordering.py asserts the order of release
    # exactly.
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(_echo, server, 0, delay_ms=2000)
        wait_until(lambda: requests_in(server.metrics_url, "echo") == 1, "the first request is in")
        second = pool.submit(_echo, server, 1)
        if preserve:
            wait_until(lambda: _statistics(server, "echo")["execution_count"] == 1, "the second request ran")
            assert not first.done()
            assert not second.done()  # executed, its answer held behind the first's
        else:
            assert second.result(timeout=60) == 1
            assert not first.done()  # answered while the first still runs
        assert (first.result(timeout=60), second.result(timeout=60)) == (0, 1)
    assert _statistics(server, "echo")["execution_count"] == 2


@pytest.mark.parametrize("grpc_server", ["native", "grpcio"])
@pytest.mark.parametrize("where", ["queued", "executing"])
def test_a_cancelled_request_leaves_the_rest_of_its_batch_their_answers(
    coreserve_server: ServerFactory,
    tmp_path: Path,
    echo_backend_site: Path,
    grpc_server: str,
    where: str,
) -> None:
    # A batch leaves the queue only when it is full (four requests; the queue delay is an
    # hour) and runs for a second. The client of one gRPC call gives up while it waits in
    # the queue (three queued), or while its batch runs (four sent, so the batch left at once).
    write_model(
        tmp_path,
        "echo",
        b"",
        ECHO.format(batching="max_queue_delay_microseconds: 3600000000", delay=1000, count=1, max_batch=4),
        filename="model.echo",
    )
    server = coreserve_server(tmp_path, f"--grpc-server={grpc_server}", env=_env(echo_backend_site))
    pending = partial(requests_in, server.metrics_url, "echo")
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: dict[int, object] = {}
    done = threading.Semaphore(0)

    def finished(value: int, result: grpcclient.InferResult | None, error: Exception | None) -> None:
        answers[value] = error if error is not None else int(result.as_numpy("OUT")[0, 0])  # type: ignore[union-attr]
        done.release()

    def send(value: int) -> Any:  # tritonclient's CallContext
        tensor = grpcclient.InferInput("IN", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[value]], np.int32))
        return client.async_infer("echo", [tensor], partial(finished, value))

    try:
        calls = [send(value) for value in ([0, 1, 2, 3] if where == "executing" else [0, 1, 2])]
        wait_until(lambda: pending() == len(calls), "the calls are in")
        calls[2].cancel()
        if where == "queued":
            wait_until(lambda: pending() == 2, "the cancelled call left the queue")
            calls += [send(3), send(4)]  # they fill the batch: it runs without the cancelled one
        for _ in calls:
            assert done.acquire(timeout=30)
    finally:
        client.close()
    served = [0, 1, 3] if where == "executing" else [0, 1, 3, 4]
    assert [answers[value] for value in served] == served, (where, answers)
    assert isinstance(answers[2], InferenceServerException) and answers[2].status() == "StatusCode.CANCELLED"
    stats = _statistics(server, "echo")
    assert stats["execution_count"] == 1  # one batch held them all
    # A batch ran only once four requests were in it (the queue holds fewer for an hour): when
    # it ran with the cancelled call, the three others succeeded in it; when the call was
    # cancelled in the queue, two more took its place and all four succeeded.
    succeeded = 3 if where == "executing" else 4
    assert [(entry["batch_size"], entry["compute_infer"]["count"]) for entry in stats["batch_stats"]] == [
        (succeeded, 1)
    ]
    assert (stats["inference_stats"]["success"]["count"], stats["inference_stats"]["fail"]["count"]) == (
        succeeded,
        1,
    )
    assert "Traceback" not in server.log
