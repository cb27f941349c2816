"""The steps after a decoupled one, as Triton's ensemble runs them (its QA L0_simple_ensemble):
each response of the streaming step goes on at once, beside the others (so a batching step
after it batches them), `max_inflight_requests` sends one request of a step at a time, and a
step's full queue ends the stream with one error while the server serves on."""

from __future__ import annotations

import queue
import shutil
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerProcess
from support.model_builders import write_model
from support.paths import TESTS

INT32_1 = "data_type: TYPE_INT32 dims: [ 1 ]"
DOUBLE = """
import time

import triton_python_backend_utils as pb_utils

DELAY_S = {delay}


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(DELAY_S)
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("DOUBLED", pb_utils.get_input_tensor_by_name(r, "VALUE").as_numpy() * 2)]
            )
            for r in requests
        ]
"""
# N responses (N .. 1), the final flag on the last one.
COUNTDOWN_FINAL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            count = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            for value in range(count, 0, -1):
                flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if value == 1 else 0
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("VALUE", np.array([value], np.int32))]), flags=flags)
        return None
"""
# Batches what comes within 0.4 s; the other takes 0.3 s a request and queues one at most.
BATCHED = "max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 400000 }"
QUEUED = "max_batch_size: 1\ndynamic_batching { default_queue_policy { max_queue_size: 1 } }"


def _streaming_ensemble(repository: Path, name: str, consumer: str, scheduling: str = "") -> None:
    (repository / name / "1").mkdir(parents=True)
    (repository / name / "config.pbtxt").write_text(
        f'platform: "ensemble"\ninput [ {{ name: "N" {INT32_1} }} ]\noutput [ {{ name: "DOUBLED" {INT32_1} }} ]\n'
        f"ensemble_scheduling {{ {scheduling} step [\n"
        '  { model_name: "countdown" model_version: -1 input_map { key: "N" value: "N" }'
        ' output_map { key: "VALUE" value: "value" } },\n'
        f'  {{ model_name: "{consumer}" model_version: -1 input_map {{ key: "VALUE" value: "value" }}'
        ' output_map { key: "DOUBLED" value: "DOUBLED" } } ] }\n'
        "model_transaction_policy { decoupled: true }\n"
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("flows")
    shutil.copytree(TESTS / "plugins" / "python" / "models" / "countdown", repository / "countdown")
    io = f'input [ {{ name: "VALUE" {INT32_1} }} ]\noutput [ {{ name: "DOUBLED" {INT32_1} }} ]'
    for name, delay, scheduling in (("batched_double", 0, BATCHED), ("queued_double", 0.3, QUEUED)):
        write_model(repository, name, DOUBLE.format(delay=delay).encode(),
                    f'backend: "python"\n{scheduling}\n{io}', filename="model.py")  # fmt: skip
    _streaming_ensemble(repository, "fan_out", "batched_double")
    _streaming_ensemble(repository, "fan_out_limited", "batched_double", "max_inflight_requests: 1")
    _streaming_ensemble(repository, "fan_out_queue_full", "queued_double")
    # The decoupled step's outputs are the ensemble's: no step after it.
    write_model(repository, "countdown_final", COUNTDOWN_FINAL.encode(),
                f'backend: "python"\nmodel_transaction_policy {{ decoupled: true }}\n'
                f'input [ {{ name: "N" {INT32_1} }} ]\noutput [ {{ name: "VALUE" {INT32_1} }} ]',
                filename="model.py")  # fmt: skip
    (repository / "countdown_limited" / "1").mkdir(parents=True)
    (repository / "countdown_limited" / "config.pbtxt").write_text(
        f'platform: "ensemble"\ninput [ {{ name: "N" {INT32_1} }} ]\noutput [ {{ name: "VALUE" {INT32_1} }} ]\n'
        'ensemble_scheduling { max_inflight_requests: 1 step [ { model_name: "countdown_final" model_version: -1'
        ' input_map { key: "N" value: "N" } output_map { key: "VALUE" value: "VALUE" } } ] }\n'
        "model_transaction_policy { decoupled: true }\n"
    )
    process = ServerProcess([repository], []).start(timeout=120)
    yield process
    process.close()


def _stream(
    server: ServerProcess, model: str, count: int, output: str = "DOUBLED", empty_final: bool = True
) -> tuple[list[int], list[str]]:
    """One request of `count` values on a gRPC stream, read up to its final flag or its error:
    the values answered (the last negated where it carried the final flag), and the errors."""
    answers: queue.Queue[object] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    values: list[int] = []
    errors: list[str] = []
    try:
        client.start_stream(callback=partial(lambda q, result, error: q.put(error or result), answers))
        tensor = grpcclient.InferInput("N", [1], "INT32")
        tensor.set_data_from_numpy(np.array([count], np.int32))
        client.async_stream_infer(model, [tensor], enable_empty_final_response=empty_final)
        while True:
            answer = answers.get(timeout=60)
            if isinstance(answer, InferenceServerException):
                errors.append(answer.message() or "")
                return values, errors
            response = answer.get_response()  # type: ignore[attr-defined]
            final = response.parameters["triton_final_response"].bool_param
            if response.outputs:
                value = int(answer.as_numpy(output)[0])  # type: ignore[attr-defined]
                values.append(-value if final else value)
            if final:
                return values, errors
    finally:
        client.stop_stream()
        client.close()


def _counts(server: ServerProcess) -> tuple[int, int, set[int]]:
    """batched_double's inference and execution counts, and the batch sizes it has run."""
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        stats = client.get_inference_statistics("batched_double")["model_stats"][0]
    finally:
        client.close()
    sizes = {batch["batch_size"] for batch in stats.get("batch_stats", [])}
    return stats["inference_count"], stats["execution_count"], sizes


def test_the_responses_of_a_decoupled_step_go_on_side_by_side(server: ServerProcess) -> None:
    inferences, executions, _ = _counts(server)
    values, errors = _stream(server, "fan_out", 4)
    assert (sorted(map(abs, values)), errors) == ([2, 4, 6, 8], [])
    after_inferences, after_executions, sizes = _counts(server)
    # Batched together: each response waited for no other to go through first.
    assert after_inferences - inferences == 4
    assert after_executions - executions < 4 and max(sizes) > 1


def test_max_inflight_requests_sends_one_request_of_a_step_at_a_time(server: ServerProcess) -> None:
    inferences, executions, _ = _counts(server)
    values, errors = _stream(server, "fan_out_limited", 4)
    assert (sorted(map(abs, values)), errors) == ([2, 4, 6, 8], [])
    after_inferences, after_executions, _ = _counts(server)
    assert after_inferences - inferences == after_executions - executions == 4  # never two in a batch
    assert "Ensemble model 'fan_out_limited' configured with max_inflight_requests: 1" in server.log


def test_a_full_queue_in_a_step_after_a_decoupled_one_ends_the_stream_with_one_error(
    server: ServerProcess,
) -> None:
    values, errors = _stream(server, "fan_out_queue_full", 8)
    assert len(values) < 8 and all(value in range(2, 17, 2) for value in values)  # (none final)
    assert len(errors) == 1 and "Exceeds maximum queue size" in errors[0]
    assert errors[0].startswith("in ensemble 'fan_out_queue_full', ")
    assert _stream(server, "fan_out_queue_full", 1) == ([-2], [])  # the server serves on
    assert "Traceback" not in server.log


def test_under_max_inflight_requests_the_final_flag_rides_on_the_last_response(server: ServerProcess) -> None:
    """A client that waits for the final flag without asking for an empty final response gets
    it on the last value, which carried it from the step (it waited until its own timeout where
    the step's slot held the stream's end back)."""
    assert _stream(server, "countdown_limited", 3, output="VALUE", empty_final=False) == ([3, 2, -1], [])
