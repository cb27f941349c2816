"""The sequence id and flags through an ensemble, as Triton's ensemble carries them: every
response says them in its parameters `sequence_id`, `sequence_start` and `sequence_end`
(checked side by side with Triton 2.51; its QA L0_simple_ensemble reads them on a gRPC
stream), each step's request runs under them, and a step whose response sets them passes its
own to the steps after it and to the ensemble's response (Triton's ensemble scheduler; its
Python backend of 2.51 cannot set response parameters, so that part is checked against its
source)."""

from __future__ import annotations

import queue
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

INT32_1 = "data_type: TYPE_INT32 dims: [ 1 ]"
INT64_1 = "data_type: TYPE_INT64 dims: [ 1 ]"
START, END = 1, 2  # Triton's request flags, as a Python model's request.flags() says them

# OUT = IN, with the response parameters its value picks: 1 starts sequence 42, 2 ends the
# request's sequence, 3 gives a flag of the wrong type; any other value sets none.
FLAGGER = """
import triton_python_backend_utils as pb_utils

PARAMETERS = {1: {"sequence_id": 42, "sequence_start": True}, 2: {"sequence_end": True},
              3: {"sequence_start": 1}}


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            parameters = PARAMETERS.get(int(value[0]), {})
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)], parameters=parameters))
        return responses
"""
# N responses of sequence 99: the first starts it, the last ends it (decoupled).
FLAG_STREAM = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            count = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            for index in range(count):
                parameters = {"sequence_id": 99, "sequence_start": index == 0, "sequence_end": index == count - 1}
                outputs = [pb_utils.Tensor("OUT", np.array([index], np.int32))]
                sender.send(pb_utils.InferenceResponse(outputs, parameters=parameters))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
# The sequence id (0 for a string) and flags its request came with (Y, optional, is only read).
ECHO_SEQUENCE = """
import numpy as np
import triton_python_backend_utils as pb_utils


def _numeric(sequence_id):
    return sequence_id if isinstance(sequence_id, int) else 0


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([
                pb_utils.Tensor("CORRID", np.array([_numeric(request.correlation_id())], np.int64)),
                pb_utils.Tensor("FLAGS", np.array([request.flags()], np.int64)),
            ])
            for request in requests
        ]
"""


def _python_model(repository: Path, name: str, source: str, config: str) -> None:
    write_model(repository, name, source.encode(), f'backend: "python"\n{config}', filename="model.py")


def _ensemble(repository: Path, name: str, inputs: str, steps: str, extra: str = "") -> None:
    (repository / name / "1").mkdir(parents=True)
    (repository / name / "config.pbtxt").write_text(
        f'platform: "ensemble"\ninput [ {inputs} ]\n'
        f'output [ {{ name: "CORRID" {INT64_1} }}, {{ name: "FLAGS" {INT64_1} }} ]\n'
        f"ensemble_scheduling {{ step [ {steps} ] }}\n{extra}"
    )


def _echo_step(x: str, y: str | None = None) -> str:
    extra = f' input_map {{ key: "Y" value: "{y}" }}' if y else ""
    return (
        f'{{ model_name: "echo_sequence" model_version: -1 input_map {{ key: "X" value: "{x}" }}{extra}'
        ' output_map { key: "CORRID" value: "CORRID" } output_map { key: "FLAGS" value: "FLAGS" } }'
    )


def _flagger_step(source: str, target: str) -> str:
    return (
        f'{{ model_name: "flagger" model_version: -1 input_map {{ key: "IN" value: "{source}" }}'
        f' output_map {{ key: "OUT" value: "{target}" }} }}'
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("sequence-marks")
    _python_model(repository, "flagger", FLAGGER,
                  f'input [ {{ name: "IN" {INT32_1} }} ]\noutput [ {{ name: "OUT" {INT32_1} }} ]')  # fmt: skip
    _python_model(repository, "flag_stream", FLAG_STREAM,
                  f'input [ {{ name: "N" {INT32_1} }} ]\noutput [ {{ name: "OUT" {INT32_1} }} ]\n'
                  "model_transaction_policy { decoupled: true }")  # fmt: skip
    _python_model(repository, "echo_sequence", ECHO_SEQUENCE,
                  f'input [ {{ name: "X" {INT32_1} }}, {{ name: "Y" {INT32_1} optional: true }} ]\n'
                  f'output [ {{ name: "CORRID" {INT64_1} }}, {{ name: "FLAGS" {INT64_1} }} ]')  # fmt: skip
    _ensemble(repository, "echo", f'{{ name: "IN" {INT32_1} }}', _echo_step("IN"))
    _ensemble(repository, "flagged", f'{{ name: "IN" {INT32_1} }}',
              f'{_flagger_step("IN", "mid")}, {_echo_step("mid")}')  # fmt: skip
    _ensemble(repository, "two_marks", f'{{ name: "A" {INT32_1} }}, {{ name: "B" {INT32_1} }}',
              f'{_flagger_step("A", "a")}, {_flagger_step("B", "b")}, {_echo_step("a", "b")}')  # fmt: skip
    _ensemble(repository, "streamed", f'{{ name: "N" {INT32_1} }}',
              '{ model_name: "flag_stream" model_version: -1 input_map { key: "N" value: "N" }'
              f' output_map {{ key: "OUT" value: "mid" }} }}, {_echo_step("mid")}',
              extra="model_transaction_policy { decoupled: true }")  # fmt: skip
    process = ServerProcess([repository], []).start(timeout=120)
    yield process
    process.close()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    yield client
    client.close()


def _infer(
    client: httpclient.InferenceServerClient, model: str, *values: int, **sequence: object
) -> tuple[dict[str, object], int, int]:
    """The response's sequence parameters, and the sequence id and flags its last step ran under."""
    names = ("N",) if model == "streamed" else ("A", "B") if model == "two_marks" else ("IN",)
    inputs = []
    for name, value in zip(names, values, strict=True):
        tensor = httpclient.InferInput(name, [1], "INT32")
        tensor.set_data_from_numpy(np.array([value], np.int32))
        inputs.append(tensor)
    result = client.infer(model, inputs, **sequence)  # type: ignore[arg-type]
    parameters = result.get_response()["parameters"]
    return parameters, int(result.as_numpy("CORRID")[0]), int(result.as_numpy("FLAGS")[0])


def _marks(sequence_id: object, start: bool, end: bool) -> dict[str, object]:
    return {"sequence_id": sequence_id, "sequence_start": start, "sequence_end": end}


def test_every_response_says_the_requests_sequence_and_each_step_runs_under_it(
    client: httpclient.InferenceServerClient,
) -> None:
    # Outside any sequence: id 0 and both flags false, as Triton 2.51 answers.
    assert _infer(client, "echo", 5) == (_marks(0, False, False), 0, 0)
    assert _infer(client, "echo", 5, sequence_id=7, sequence_start=True) == (_marks(7, True, False), 7, START)
    assert _infer(client, "echo", 5, sequence_id=7, sequence_end=True) == (_marks(7, False, True), 7, END)
    assert _infer(client, "echo", 5, sequence_id="s1", sequence_end=True) == (
        _marks("s1", False, True),
        0,
        END,
    )


def test_a_step_that_sets_the_sequence_in_its_response_passes_it_on(
    client: httpclient.InferenceServerClient,
) -> None:
    assert _infer(client, "flagged", 0, sequence_id=7, sequence_start=True) == (
        _marks(7, True, False),
        7,
        START,
    )
    # Value 1: the first step starts sequence 42 for the next.
    assert _infer(client, "flagged", 1, sequence_id=7) == (_marks(42, True, False), 42, START)
    assert _infer(client, "flagged", 1) == (_marks(42, True, False), 42, START)
    # Value 2: it ends the request's sequence; the flags it did not set are false (Triton's rule).
    assert _infer(client, "flagged", 2, sequence_id=7, sequence_start=True) == (
        _marks(7, False, True),
        7,
        END,
    )


def test_inputs_of_different_sequences_run_under_the_first_by_name_with_an_error_logged(
    server: ServerProcess, client: httpclient.InferenceServerClient
) -> None:
    assert _infer(client, "two_marks", 1, 2, sequence_id=7) == (_marks(42, True, False), 42, START)
    assert "Different set of response parameters are set for 'echo_sequence'" in server.log
    assert _infer(client, "two_marks", 1, 1) == (_marks(42, True, False), 42, START)


def test_a_response_flag_of_the_wrong_type_fails_the_request_in_tritons_words(
    server: ServerProcess, client: httpclient.InferenceServerClient
) -> None:
    with pytest.raises(InferenceServerException) as failure:
        _infer(client, "flagged", 3)
    assert failure.value.status() == "400"
    assert failure.value.message() == (
        "in ensemble 'flagged', expect parameter 'sequence_start' to be TRITONSERVER_PARAMETER_BOOL"
    )
    assert _infer(client, "flagged", 0) == (_marks(0, False, False), 0, 0)  # the next is served
    assert "Traceback" not in server.log


def _stream(server: ServerProcess, model: str, requests: list[dict[str, object]]) -> list[object]:
    """Each request on one gRPC stream; the responses (or errors) in order, until each request's
    final flag."""
    answers: queue.Queue[object] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    name = "N" if model == "streamed" else "IN"
    try:
        client.start_stream(callback=partial(lambda q, result, error: q.put(error or result), answers))
        for value in requests:
            tensor = grpcclient.InferInput(name, [1], "INT32")
            tensor.set_data_from_numpy(np.array([value.pop("value")], np.int32))
            client.async_stream_infer(model, [tensor], enable_empty_final_response=True, **value)  # type: ignore[arg-type]
        received: list[object] = []
        finals = 0
        while finals < len(requests):
            answer = answers.get(timeout=60)
            if isinstance(answer, InferenceServerException):
                received.append(answer)
                finals += 1
                continue
            response = answer.get_response()  # type: ignore[attr-defined]
            finals += response.parameters["triton_final_response"].bool_param
            if response.outputs:
                received.append(answer)
        return received
    finally:
        client.stop_stream()
        client.close()


def _grpc_marks(result: object) -> tuple[object, bool, bool, int, int]:
    parameters = result.get_response().parameters  # type: ignore[attr-defined]
    sequence_id = parameters["sequence_id"]
    return (
        getattr(sequence_id, sequence_id.WhichOneof("parameter_choice")),
        parameters["sequence_start"].bool_param,
        parameters["sequence_end"].bool_param,
        int(result.as_numpy("CORRID")[0]),  # type: ignore[attr-defined]
        int(result.as_numpy("FLAGS")[0]),  # type: ignore[attr-defined]
    )


def test_a_sequence_on_a_grpc_stream_gets_its_flags_back_as_tritons_qa_reads_them(
    server: ServerProcess,
) -> None:
    requests: list[dict[str, object]] = [
        {"value": 5, "sequence_id": 1234, "sequence_start": True},
        {"value": 5, "sequence_id": 1234},
        {"value": 5, "sequence_id": 1234, "sequence_end": True},
    ]
    assert [_grpc_marks(result) for result in _stream(server, "echo", requests)] == [
        (1234, True, False, 1234, START),
        (1234, False, False, 1234, 0),
        (1234, False, True, 1234, END),
    ]


def test_each_response_of_a_decoupled_step_carries_its_own_sequence_flags(server: ServerProcess) -> None:
    marks = [_grpc_marks(result) for result in _stream(server, "streamed", [{"value": 3}])]
    assert marks == [(99, True, False, 99, START), (99, False, False, 99, 0), (99, False, True, 99, END)]
