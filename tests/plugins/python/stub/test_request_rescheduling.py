"""Request rescheduling (`request.set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)`)
and iterative sequences (`sequence_batching { iterative_sequence: true }`), with the two
model.py files of Triton's python backend documentation ("Request Rescheduling"). The error
texts are the ones the real Triton 2.51 logged for the same models (where Triton leaves the
client waiting, coreserve answers it with that error)."""

from __future__ import annotations

import json
import queue
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerProcess
from support.waiting import requests_in, wait_until

# The documentation's decoupled example: IN responses counting down to 0, one per execution.
DECOUPLED_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.reset_flag = True
        self.remaining_response = 0

    def execute(self, requests):
        for request in requests:
            in_input = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if self.reset_flag:
                self.remaining_response = in_input[0]
                self.reset_flag = False
            response_sender = request.get_response_sender()
            self.remaining_response -= 1
            out_output = pb_utils.Tensor("OUT", np.array([self.remaining_response], np.int32))
            response = pb_utils.InferenceResponse(output_tensors=[out_output])
            if self.remaining_response <= 0:
                response_sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                self.reset_flag = True
            else:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                response_sender.send(response)
        return None
"""
# The documentation's non-decoupled example: every other execution hands its request back
# (None in its place), the next one answers it. NONE_IN_PLACE=False returns a response instead.
ORDINARY_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

NONE_IN_PLACE = {none_in_place}


class TritonPythonModel:
    def initialize(self, args):
        self.idx = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            response = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value + 100)])
            if self.idx == 0:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                responses.append(None if NONE_IN_PLACE else response)
                self.idx += 1
            else:
                self.idx = 0
                responses.append(response)
        return responses
"""
# Each execution answers correlation id * 10 + request flags, and hands the request back twice.
FLAGS_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.runs = {}

    def execute(self, requests):
        for request in requests:
            key = request.correlation_id()
            self.runs[key] = self.runs.get(key, 0) + 1
            value = pb_utils.Tensor("OUT", np.array([[key * 10 + request.flags()]], np.int32))
            sender = request.get_response_sender()
            if self.runs[key] < 3:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                sender.send(pb_utils.InferenceResponse([value]))
            else:
                del self.runs[key]
                sender.send(
                    pb_utils.InferenceResponse([value]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                )
        return None
"""
CONFIG = """
backend: "python"
max_batch_size: 4
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
model_transaction_policy {{ decoupled: {decoupled} }}
{scheduling}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""
ITERATIVE = "sequence_batching { iterative_sequence: true }"
MODELS = {
    "countdown_iterative": (DECOUPLED_MODEL, True, ITERATIVE),
    "countdown_dynamic": (DECOUPLED_MODEL, True, "dynamic_batching { }"),
    "twice_iterative": (ORDINARY_MODEL.format(none_in_place=True), False, ITERATIVE),
    "twice_default": (ORDINARY_MODEL.format(none_in_place=True), False, ""),
    "twice_answering": (ORDINARY_MODEL.format(none_in_place=False), False, ITERATIVE),
    "flags_iterative": (FLAGS_MODEL, True, ITERATIVE),
    "countdown_abandoned": (DECOUPLED_MODEL, True, ITERATIVE),
}
REFUSED = (
    "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not "
    "configured to handle such a flag."
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("rescheduling")
    for name, (model, decoupled, scheduling) in MODELS.items():
        (repository / name / "1").mkdir(parents=True)
        (repository / name / "1" / "model.py").write_text(model)
        config = CONFIG.format(decoupled=str(decoupled).lower(), scheduling=scheduling)
        (repository / name / "config.pbtxt").write_text(config)
    process = ServerProcess([repository])
    try:
        process.start(timeout=120)
        yield process
        log = process.log
    finally:
        process.close()
    assert "Traceback" not in log, log
    assert "iterative_sequence" not in log  # no longer warned about as ignored


def _stream(server: ServerProcess, model: str, value: int, **sequence: object) -> list[tuple[str, object]]:
    """One request over a gRPC stream: ("out", value) per response, ("error", text), "final"."""
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    received: list[tuple[str, object]] = []
    try:
        tensor = grpcclient.InferInput("IN", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[value]], np.int32))
        client.async_stream_infer(model, [tensor], enable_empty_final_response=True, **sequence)
        while True:
            result, error = results.get(timeout=60)
            if error is not None:
                received.append(("error", str(error)))
                break
            response = result.get_response()
            if result.as_numpy("OUT") is not None:
                received.append(("out", int(result.as_numpy("OUT")[0][0])))
            if response.parameters["triton_final_response"].bool_param:
                received.append(("final", None))
                break
    finally:
        client.stop_stream()
        client.close()
    return received


def _statistics(server: ServerProcess, model: str) -> dict:
    with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{model}/stats", timeout=30) as reply:
        return json.loads(reply.read())["model_stats"][0]


def test_an_iterative_sequence_runs_a_decoupled_request_until_it_is_answered(server: ServerProcess) -> None:
    assert _stream(server, "countdown_iterative", 3) == [("out", 2), ("out", 1), ("out", 0), ("final", None)]
    # One request, executed three times, counted once as a success (the last execution is
    # counted as its execute returns, which may come after the client has the final response).
    wait_until(lambda: _statistics(server, "countdown_iterative")["execution_count"] == 3, "three executions")
    stats = _statistics(server, "countdown_iterative")
    assert stats["execution_count"] == 3
    assert stats["inference_stats"]["success"]["count"] == 1
    assert stats["inference_stats"]["fail"]["count"] == 0
    # The same over HTTP server-sent events, and again (the sequence slot was given back).
    for _ in range(2):
        request = urllib.request.Request(
            f"http://{server.http_url}/v2/models/countdown_iterative/generate_stream",
            data=json.dumps({"IN": [2]}).encode(),
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=60) as reply:
            body = reply.read().decode()
        events = [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: ")]
        assert [event["OUT"] for event in events] == [1, 0]


def test_an_iterative_sequence_answers_an_ordinary_request_after_it_was_handed_back(
    server: ServerProcess,
) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        for value in (5, 7):
            tensor = httpclient.InferInput("IN", [1, 1], "INT32")
            tensor.set_data_from_numpy(np.array([[value]], np.int32))
            assert client.infer("twice_iterative", [tensor]).as_numpy("OUT").tolist() == [[value + 100]]
    finally:
        client.close()
    stats = _statistics(server, "twice_iterative")
    assert stats["execution_count"] == 4
    assert stats["inference_stats"]["success"]["count"] == 2


def test_a_model_without_iterative_sequences_cannot_hand_requests_back(server: ServerProcess) -> None:
    # Decoupled: the responses sent before come through, then the request fails.
    assert _stream(server, "countdown_dynamic", 3) == [("out", 2), ("error", REFUSED)]
    # Ordinary: the request fails with the same error, over HTTP and gRPC.
    tensor = httpclient.InferInput("IN", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[1]], np.int32))
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        with pytest.raises(InferenceServerException) as info:
            client.infer("twice_default", [tensor])
        assert info.value.status() == "500" and info.value.message() == REFUSED
        # The model answers on its next execution (it hands back every other request).
        assert client.infer("twice_default", [tensor]).as_numpy("OUT").tolist() == [[101]]
    finally:
        client.close()
    grpc_tensor = grpcclient.InferInput("IN", [1, 1], "INT32")
    grpc_tensor.set_data_from_numpy(np.array([[1]], np.int32))
    with (
        grpcclient.InferenceServerClient(server.grpc_url) as grpc_client,
        pytest.raises(InferenceServerException) as grpc_info,
    ):
        grpc_client.infer("twice_default", [grpc_tensor])
    assert grpc_info.value.status() == "StatusCode.INTERNAL" and grpc_info.value.message() == REFUSED
    assert _statistics(server, "twice_default")["inference_stats"]["fail"]["count"] == 2
    # One log line per refused request, naming the model.
    assert server.log.count(REFUSED) == 3
    assert "model 'twice_default' version 1: failed to release request" in server.log


def test_a_response_for_a_request_handed_back_is_refused_as_triton_refuses_it(server: ServerProcess) -> None:
    tensor = httpclient.InferInput("IN", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[1]], np.int32))
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        with pytest.raises(InferenceServerException) as info:
            client.infer("twice_answering", [tensor])
    finally:
        client.close()
    assert (
        "Expected a None object in the execute function return list for reschduled request, found type "
        in info.value.message()
    )


def test_a_handed_back_request_runs_with_its_sequence_id_and_start_only_once(server: ServerProcess) -> None:
    # Without a sequence id the batcher gives one (Triton counts from 1) and START.
    first = _stream(server, "flags_iterative", 0)
    assert [kind for kind, _ in first] == ["out", "out", "out", "final"]
    auto_id = int(first[0][1]) // 10  # type: ignore[call-overload]
    assert auto_id >= 1
    assert [value for _, value in first[:3]] == [auto_id * 10 + 1, auto_id * 10, auto_id * 10]
    # A client's sequence keeps its id; START only on the first execution, END until answered.
    assert _stream(server, "flags_iterative", 0, sequence_id=42, sequence_start=True, sequence_end=True) == [
        ("out", 423),
        ("out", 422),
        ("out", 422),
        ("final", None),
    ]


def test_a_handed_back_request_whose_client_leaves_is_not_run_again(server: ServerProcess) -> None:
    # A countdown from 100,000 hands its request back after each response; the client closes
    # its stream after 20 of them: the request leaves the sequence batcher, CANCELED.
    received: list[int] = []
    client = grpcclient.InferenceServerClient(server.grpc_url)
    tensor = grpcclient.InferInput("IN", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[100_000]], np.int32))
    client.start_stream(callback=lambda result, error: received.append(0 if error else 1))
    client.async_stream_infer("countdown_abandoned", [tensor])
    wait_until(lambda: len(received) >= 20, "the first responses arrive", 60, 0.01)
    client.stop_stream(cancel_requests=True)
    client.close()
    # Failed once, and no longer queued or executing: nothing of it is left to run again.
    wait_until(
        lambda: _statistics(server, "countdown_abandoned")["inference_stats"]["fail"]["count"] == 1,
        "the request fails, cancelled",
        30,
        0.05,
    )
    wait_until(
        lambda: requests_in(server.metrics_url, "countdown_abandoned") == 0, "it leaves the batcher", 30
    )
    executed = _statistics(server, "countdown_abandoned")["execution_count"]
    time.sleep(0.5)  # an absence: it would have run hundreds of times more by now
    stats = _statistics(server, "countdown_abandoned")
    assert stats["execution_count"] == executed < 100_000
    assert stats["inference_stats"]["success"]["count"] == 0
    with urllib.request.urlopen(server.metrics_url, timeout=30) as reply:
        metrics = reply.read().decode().splitlines()
    canceled = [
        line
        for line in metrics
        if line.startswith("nv_inference_request_failure{")
        and 'model="countdown_abandoned"' in line
        and 'reason="CANCELED"' in line
    ]
    assert len(canceled) == 1 and canceled[0].endswith(" 1"), canceled
