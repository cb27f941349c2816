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

# Each execution sleeps IN[0] milliseconds, notes (in the file its parameter names) when it
# ran, its request's id and whether it was cancelled, and answers its stub's process id.
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


@pytest.mark.parametrize("model", ["one", "unpipelined"])
def test_executions_run_one_at_a_time_and_waiting_counts_as_queue_time(
    server: tuple[ServerProcess, Path], model: str
) -> None:
    process, repository = server
    before = _stats(process, model)
    with ThreadPoolExecutor(4) as pool:  # four requests at once, 200 ms of work each
        pids = list(pool.map(lambda n: _call(process, model, f"{model}-{n}", 200), range(4)))
    assert len(set(pids)) == 1  # one instance, one stub
    spans = sorted(_notes(repository, model).values())
    for (_, end, _), (start, _, _) in itertools.pairwise(spans):
        assert start >= end  # never two executions at once
    after = _stats(process, model)
    compute = sum(after[key] - before[key] for key in ("compute_input", "compute_infer", "compute_output"))
    queue = after["queue"] - before["queue"]
    # Four executions of 200 ms: 0.8 s of compute; the waits behind each other (0.2 + 0.4 +
    # 0.6 s) are queue time, wherever the requests waited (the server's queue or the stub).
    assert 0.8e9 <= compute < 1.4e9, compute
    assert queue >= 1.0e9, queue


def test_a_request_cancelled_while_it_waits_in_the_stub_never_reaches_the_model(
    server: tuple[ServerProcess, Path],
) -> None:
    process, repository = server
    with httpclient.InferenceServerClient(process.http_url) as client:
        before = client.get_inference_statistics("one")["model_stats"][0]
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(_call, process, "one", "running", 1500)
        time.sleep(0.3)  # the stub runs it; the next request is handed to the stub behind it
        tensor = grpcclient.InferInput("IN", [1], "INT32")
        tensor.set_data_from_numpy(np.array([0], np.int32))
        client = grpcclient.InferenceServerClient(process.grpc_url)
        try:
            with pytest.raises(InferenceServerException) as info:
                client.infer("one", [tensor], request_id="gave-up", client_timeout=0.3)
        finally:
            client.close()
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
    process, _ = server
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(_call, process, "two", "first", 1000)
        time.sleep(0.3)
        started = time.monotonic()
        second = _call(process, "two", "second", 0)
        waited = time.monotonic() - started
        assert first.result(timeout=60) != second  # each ran in a stub of its own
    assert waited < 0.7, waited  # not behind the first request's second of work


def test_requests_that_arrive_together_spread_over_the_instances(server: tuple[ServerProcess, Path]) -> None:
    process, _ = server
    started = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        pids = list(pool.map(lambda n: _call(process, "two", f"together-{n}", 600), range(2)))
    assert len(set(pids)) == 2  # side by side, one on each instance
    assert time.monotonic() - started < 1.1  # not 1.2 s, one after the other


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
