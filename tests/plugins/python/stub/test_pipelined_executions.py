"""Executions handed to a stub ahead of time (the `pipeline_depth` parameter, default 8).

Under the default scheduler the server hands a Python model's stub its next executions while
it runs one; they wait in the stub, in order. These tests check what a model and a client
must not notice: executions still run one at a time and in order, the time a request waits
in the stub counts as queue time, not compute time, a request cancelled while it waits never
reaches the model (as one cancelled in the server's queue), and a request goes to an idle
instance rather than behind another instance's execution.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerProcess
from support.waiting import EXECUTING, PENDING, model_gauges, requests_in, wait_until

# Each execution sleeps IN[0] milliseconds, notes (in the file its parameter names) when it
# ran, its request's id and whether it was cancelled, and answers its stub's process id. A
# request the test holds (a file `<notes>.<id>.hold` exists) first says so (`.held`) and waits
# for the test to release it (`.release`): the test then knows, rather than guesses, what runs.
MODEL = """
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        import json
        self.notes = json.loads(args["model_config"])["parameters"]["notes"]["string_value"]

    def execute(self, requests):
        responses = []
        for request in requests:
            started = time.monotonic()
            mark = f"{self.notes}.{request.request_id()}"
            if os.path.exists(mark + ".hold"):
                open(mark + ".held", "w").close()
                while not os.path.exists(mark + ".release"):
                    time.sleep(0.01)
            delay_ms = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            time.sleep(delay_ms / 1000)
            with open(self.notes, "a") as notes:
                notes.write(f"{request.request_id()} {started} {time.monotonic()} {request.is_cancelled()}\\n")
            out = pb_utils.Tensor("OUT", np.array([os.getpid()], np.int64))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
"""
CONFIG = """
backend: "python"
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT64 dims: [ 1 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
parameters {{ key: "notes" value: {{ string_value: "{notes}" }} }}
{extra}
"""
MODELS = {
    "one": (1, ""),
    "two": (2, ""),
    "unpipelined": (1, 'parameters { key: "pipeline_depth" value: { string_value: "1" } }'),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    repository = tmp_path_factory.mktemp("pipelined")
    for name, (count, extra) in MODELS.items():
        (repository / name / "1").mkdir(parents=True)
        (repository / name / "1" / "model.py").write_text(MODEL)
        notes = repository / f"{name}.notes"
        (repository / name / "config.pbtxt").write_text(CONFIG.format(count=count, notes=notes, extra=extra))
    process = ServerProcess([repository]).start(timeout=120)
    try:
        yield process, repository
    finally:
        log = process.log
        process.close()
    assert "Traceback" not in log, log


def _call(server: ServerProcess, model: str, request_id: str, delay_ms: int) -> int:
    tensor = httpclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([delay_ms], np.int32))
    with httpclient.InferenceServerClient(server.http_url, network_timeout=60) as client:
        return int(client.infer(model, [tensor], request_id=request_id).as_numpy("OUT")[0])


def _notes(repository: Path, model: str) -> dict[str, tuple[float, float, bool]]:
    rows = [line.split() for line in (repository / f"{model}.notes").read_text().splitlines()]
    return {row[0]: (float(row[1]), float(row[2]), row[3] == "True") for row in rows}


def _stats(server: ServerProcess, model: str) -> dict[str, int]:
    with httpclient.InferenceServerClient(server.http_url) as client:
        inference = client.get_inference_statistics(model)["model_stats"][0]["inference_stats"]
    return {key: int(value["ns"]) for key, value in inference.items() if isinstance(value, dict)}


def _hold(repository: Path, model: str, request_id: str) -> Path:
    """Makes the request `request_id` wait in the model until the returned file exists."""
    mark = repository / f"{model}.notes.{request_id}"
    Path(f"{mark}.hold").touch()
    return Path(f"{mark}.release")


def _held(repository: Path, model: str, request_id: str) -> bool:
    """Whether the model is running the held request `request_id` (and waits for its release)."""
    return Path(f"{repository / f'{model}.notes.{request_id}'}.held").exists()


@pytest.mark.parametrize("model", ["one", "unpipelined"])
def test_executions_run_one_at_a_time_and_waiting_counts_as_queue_time(
    server: tuple[ServerProcess, Path], model: str
) -> None:
    process, repository = server
    before = _stats(process, model)
    release = _hold(repository, model, f"{model}-0")
    with ThreadPoolExecutor(4) as pool:  # four requests at once, 200 ms of work each
        first = pool.submit(_call, process, model, f"{model}-0", 200)
        wait_until(lambda: _held(repository, model, f"{model}-0"), "the first request runs")
        rest = [pool.submit(_call, process, model, f"{model}-{n}", 200) for n in (1, 2, 3)]
        # The three others have reached the server (its queue, or the stub behind the first):
        wait_until(lambda: requests_in(process.metrics_url, model) == 4, "four requests in")
        # As on Triton, those the stub has not begun are pending, handed ahead to it or not.
        assert model_gauges(process.metrics_url, model, PENDING, EXECUTING) == [3, 1]
        all_queued = time.monotonic()
        release.touch()
        pids = [first.result(timeout=60), *(call.result(timeout=60) for call in rest)]
    assert len(set(pids)) == 1  # one instance, one stub
    notes = {name: note for name, note in _notes(repository, model).items() if name.startswith(f"{model}-")}
    spans = sorted((start, end) for start, end, _ in notes.values())
    assert len(spans) == 4 and spans[0] == notes[f"{model}-0"][:2]  # the held one ran first
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end  # never two executions at once
    after = _stats(process, model)
    compute = sum(after[key] - before[key] for key in ("compute_input", "compute_infer", "compute_output"))
    queue = after["queue"] - before["queue"]
    success = after["success"] - before["success"]
    # Compute time covers each execution's work (the spans the model noted, on the same clock)
    # and no more than what is left of each request's time in the server after its queue time.
    assert 0.8e9 <= sum(end - start for start, end in spans) * 1e9 <= compute <= success - queue, compute
    # Split as Triton's Python backend splits it: the model's execute is compute-infer; getting the
    # inputs to it and the outputs back, compute-input and compute-output (small, never 0).
    infer = after["compute_infer"] - before["compute_infer"]
    assert sum(end - start for start, end in spans) * 1e9 <= infer < compute, (infer, compute)
    assert (
        after["compute_input"] > before["compute_input"]
        and after["compute_output"] > before["compute_output"]
    )
    # The three others were queued before `all_queued` and none started before the execution
    # ahead of it ended: the time between is queue time, wherever they waited (the server's
    # queue or the stub). Were it counted as compute, their queue time would be far less.
    waited = sum(end - all_queued for _, end in spans[:3])
    assert queue >= max(1.0e9, waited * 1e9), (queue, waited)


def test_a_request_cancelled_while_it_waits_in_the_stub_never_reaches_the_model(
    server: tuple[ServerProcess, Path],
) -> None:
    process, repository = server
    with httpclient.InferenceServerClient(process.http_url) as client:
        before = client.get_inference_statistics("one")["model_stats"][0]
    release = _hold(repository, "one", "running")
    with ThreadPoolExecutor(1) as pool:
        # It runs, held; the next request is handed to the stub behind it.
        slow = pool.submit(_call, process, "one", "running", 1000)
        wait_until(lambda: _held(repository, "one", "running"), "the first request runs")
        tensor = grpcclient.InferInput("IN", [1], "INT32")
        tensor.set_data_from_numpy(np.array([0], np.int32))
        client = grpcclient.InferenceServerClient(process.grpc_url)
        try:
            with pytest.raises(InferenceServerException) as info:
                client.infer("one", [tensor], request_id="gave-up", client_timeout=0.3)
        finally:
            client.close()
            release.touch()  # its last second of work gives the cancellation time to arrive
        assert info.value.status() == "StatusCode.DEADLINE_EXCEEDED"
        slow.result(timeout=60)
        assert _call(process, "one", "after", 0)  # the stub goes on with the next one
    notes = _notes(repository, "one")
    assert "running" in notes and "after" in notes
    assert "gave-up" not in notes  # as a request cancelled in the server's queue
    with httpclient.InferenceServerClient(process.http_url) as client:
        after = client.get_inference_statistics("one")["model_stats"][0]
    assert int(after["execution_count"]) - int(before["execution_count"]) == 2
    failed = int(after["inference_stats"]["fail"]["count"]) - int(before["inference_stats"]["fail"]["count"])
    assert failed == 1


def test_a_request_goes_to_an_idle_instance_not_behind_a_busy_one(server: tuple[ServerProcess, Path]) -> None:
    process, repository = server
    release = _hold(repository, "two", "first")
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(_call, process, "two", "first", 0)
        try:
            wait_until(lambda: _held(repository, "two", "first"), "the first request runs")
            # Answered while the first is still held: it did not wait behind it.
            second = pool.submit(_call, process, "two", "second", 0).result(timeout=60)
            assert not first.done()
        finally:
            release.touch()
        assert first.result(timeout=60) != second  # each ran in a stub of its own


def test_requests_that_arrive_together_spread_over_the_instances(server: tuple[ServerProcess, Path]) -> None:
    process, repository = server
    names = ["together-0", "together-1"]
    releases = [_hold(repository, "two", name) for name in names]
    with ThreadPoolExecutor(2) as pool:
        calls = [pool.submit(_call, process, "two", name, 0) for name in names]
        try:
            # Both run at once (each holds its instance until released), not one after the other.
            wait_until(lambda: all(_held(repository, "two", name) for name in names), "both requests run")
        finally:
            for release in releases:
                release.touch()
        pids = [call.result(timeout=60) for call in calls]
    assert len(set(pids)) == 2  # side by side, one on each instance


@pytest.mark.parametrize(
    ("parameter", "value", "whole_numbers"),
    [
        *[("pipeline_depth", value, "1 to 64") for value in ("0", "65", "two", "-1", "")],
        *[("idle_spin_microseconds", value, "0 to 10000") for value in ("10001", "-5", "0.5", "soon", "")],
    ],
)
def test_coreserve_parameters_out_of_range_fail_the_load(
    tmp_path: Path, parameter: str, value: str, whole_numbers: str
) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.py").write_text(MODEL)
    extra = f'parameters {{ key: "{parameter}" value: {{ string_value: "{value}" }} }}'
    (tmp_path / "m" / "config.pbtxt").write_text(CONFIG.format(count=1, notes=tmp_path / "n", extra=extra))
    process = ServerProcess([tmp_path], ["--exit-on-error=false"]).start(timeout=120)
    try:
        with httpclient.InferenceServerClient(process.http_url) as client:
            assert not client.is_model_ready("m")
            index = {entry["name"]: entry for entry in client.get_model_repository_index()}
        log = process.log
    finally:
        process.close()
    reason = f"parameter {parameter} must be a whole number from {whole_numbers}, got '{value}'"
    assert reason in index["m"]["reason"]
    assert "Traceback" not in log
