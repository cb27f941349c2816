"""The generate extension's mapping: keys that are not model inputs reach the model as parameters.

A Python model echoes `request.parameters()` and the names of the inputs it got. Every expected
answer below is what the real Triton 2.51 answered to the same model and body (compared by
hand), except where a comment says coreserve answers 400 where Triton answered 500.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from coreserve.testing import ServerProcess

MODEL = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            names = [tensor.name() for tensor in request.inputs()]
            text = json.dumps({"params": json.loads(request.parameters()), "inputs": names})
            output = pb_utils.Tensor("text_output", np.array([text.encode()], dtype=object))
            responses.append(pb_utils.InferenceResponse([output]))
        return responses
"""
CONFIG = """
backend: "python"
max_batch_size: 0
input [
  { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] optional: true }
]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] } ]
"""
INVALID_TYPE = "parameter 'bad' has invalid type. It should be either 'int', 'bool', or 'string'."
# A decoupled model that answers its request `times` times (a generate parameter).
REPEAT_MODEL = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            if json.loads(request.parameters()).get("fail"):  # its first response is an error
                error = pb_utils.TritonError("An Error Occurred")
                sender.send(pb_utils.InferenceResponse(error=error), pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            for n in range(json.loads(request.parameters())["times"]):
                output = pb_utils.Tensor("text_output", np.array([str(n).encode()], dtype=object))
                sender.send(pb_utils.InferenceResponse([output]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
REPEAT_CONFIG = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

# A batching model that doubles its rows, so a generate request of several values is a batch.
DOUBLE_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy() * 2)])
            for r in requests
        ]
"""
DOUBLE_CONFIG = """
backend: "python"
max_batch_size: 4
input [ { name: "x" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "y" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("repository")
    folder = repository / "echo"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(CONFIG)
    (folder / "1" / "model.py").write_text(MODEL)
    (repository / "repeat" / "1").mkdir(parents=True)
    (repository / "repeat" / "config.pbtxt").write_text(REPEAT_CONFIG)
    (repository / "repeat" / "1" / "model.py").write_text(REPEAT_MODEL)
    (repository / "double" / "1").mkdir(parents=True)
    (repository / "double" / "config.pbtxt").write_text(DOUBLE_CONFIG)
    (repository / "double" / "1" / "model.py").write_text(DOUBLE_MODEL)
    process = ServerProcess([repository]).start()
    yield process
    process.close()


# Each test leaves no traceback in the server's log (tests/e2e/conftest.py).
pytestmark = pytest.mark.usefixtures("no_traceback")


def _post(
    server: ServerProcess, body: str, endpoint: str = "generate", model: str = "echo"
) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/{model}/{endpoint}", data=body.encode(), method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read().decode()
            if endpoint == "generate_stream":
                events = [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]
                return response.status, [json.loads(event) for event in events]
            return response.status, json.loads(text)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _seen(server: ServerProcess, body: str) -> dict[str, Any]:
    """What the model saw: {"params": request.parameters(), "inputs": [input names]}."""
    status, document = _post(server, body)
    assert status == 200, document
    seen: dict[str, Any] = json.loads(document["text_output"])
    return seen


def test_keys_that_are_not_inputs_reach_the_model_as_parameters(server: ServerProcess) -> None:
    body = '{"text_input": "hi", "temperature": 0.7, "top_k": 5, "stream": false, "stop": "x"}'
    assert _seen(server, body) == {
        "params": {"temperature": 0.7, "top_k": 5, "stream": False, "stop": "x"},
        "inputs": ["text_input"],
    }


def test_a_key_that_names_an_input_stays_an_input(server: ServerProcess) -> None:
    assert _seen(server, '{"text_input": "hi", "max_tokens": 7}') == {
        "params": {},
        "inputs": ["text_input", "max_tokens"],
    }


def test_the_parameters_object_adds_parameters_and_the_later_name_wins(server: ServerProcess) -> None:
    body = '{"text_input": "hi", "parameters": {"temperature": 0.5, "k": 1, "s": "x"}}'
    assert _seen(server, body)["params"] == {"temperature": 0.5, "k": 1, "s": "x"}
    later_top_level = '{"text_input": "hi", "parameters": {"temperature": 0.5}, "temperature": 0.9}'
    assert _seen(server, later_top_level)["params"] == {"temperature": 0.9}
    later_object = '{"text_input": "hi", "temperature": 0.9, "parameters": {"temperature": 0.5}}'
    assert _seen(server, later_object)["params"] == {"temperature": 0.5}


def test_the_id_is_the_request_id_and_a_parameter_as_in_triton(server: ServerProcess) -> None:
    status, document = _post(server, '{"text_input": "hi", "id": "abc"}')
    assert status == 200 and document["id"] == "abc"
    assert json.loads(document["text_output"])["params"] == {"id": "abc"}


def test_integers_beyond_int64_become_floats_as_in_triton(server: ServerProcess) -> None:
    body = '{"text_input": "hi", "big": 18446744073709551615, "neg": -5}'
    assert _seen(server, body)["params"] == {"big": 1.8446744073709552e19, "neg": -5}


def test_generate_stream_maps_the_same_way(server: ServerProcess) -> None:
    status, events = _post(
        server, '{"text_input": "hi", "max_tokens": 3, "temperature": 1}', "generate_stream"
    )
    assert status == 200 and len(events) == 1
    assert json.loads(events[0]["text_output"]) == {
        "params": {"temperature": 1},
        "inputs": ["text_input", "max_tokens"],
    }


@pytest.mark.parametrize("value", ["[1, 2]", '{"a": 1}', "null"])
def test_a_value_that_cannot_be_a_parameter_is_a_400_in_triton_words(
    server: ServerProcess, value: str
) -> None:
    status, document = _post(server, f'{{"text_input": "hi", "bad": {value}}}')
    assert status == 400 and document["error"].startswith(INVALID_TYPE)


def test_a_bad_entry_of_the_parameters_object_is_a_400_in_triton_words(server: ServerProcess) -> None:
    status, document = _post(server, '{"text_input": "hi", "parameters": {"bad": [1]}}')
    assert status == 400 and document["error"].startswith("Converting keyword: 'parameters': " + INVALID_TYPE)


def test_parameters_that_is_not_an_object_is_a_400(server: ServerProcess) -> None:
    # Triton answers 500 with this text; a client's mistake is a 400 here.
    status, document = _post(server, '{"text_input": "hi", "parameters": 5}')
    assert status == 400 and document["error"].startswith("Expected JSON object for keyword: 'parameters'")


def test_an_id_that_is_not_a_string_is_a_400(server: ServerProcess) -> None:
    # Triton answers 500 with this text; a client's mistake is a 400 here.
    status, document = _post(server, '{"text_input": "hi", "id": 5}')
    assert status == 400 and document["error"].startswith("Unable to parse 'id'")


def test_values_that_do_not_fit_an_input_are_a_400_in_triton_words(server: ServerProcess) -> None:
    status, document = _post(server, '{"text_input": "hi", "max_tokens": [1, 2]}')
    assert status == 400
    assert document["error"].startswith(
        "The schema can not convert input 'max_tokens' to tensor with proper shape"
    )


def test_values_for_a_batching_model_are_a_batch_of_rows_as_on_triton(server: ServerProcess) -> None:
    # Triton 2.51 shapes them [-1, 1] -> [3, 1]: the batch dimension takes what the dims leave.
    assert _post(server, '{"x": [1, 2, 3]}', model="double") == (
        200,
        {"model_name": "double", "model_version": "1", "y": [2, 4, 6]},
    )
    status, document = _post(server, '{"x": [1, 2, 3, 4, 5]}', model="double")
    assert status == 400
    assert document["error"].startswith(
        "[request id: <id_unknown>] inference request batch-size must be <= 4 for 'double'"
    )


@pytest.mark.parametrize("times", [0, 2, 3])
def test_generate_refuses_a_model_that_sends_other_than_one_response_in_triton_words(
    server: ServerProcess, times: int
) -> None:
    body = json.dumps({"text_input": "hi", "times": times})
    status, answer = _post(server, body, model="repeat")
    assert status == 400, answer  # (Triton 2.51 sends these words with status 200)
    assert answer["error"] == (
        "generate expects model to produce exactly 1 response, use generate stream for model that "
        "generates various number of responses"
    )
    assert _post(server, json.dumps({"text_input": "hi", "times": 1}), model="repeat") == (
        200,
        {"model_name": "repeat", "model_version": "1", "text_output": "0"},
    )
    status, events = _post(server, body, "generate_stream", model="repeat")
    assert status == 200 and [event["text_output"] for event in events] == [str(n) for n in range(times)]


@pytest.mark.parametrize("endpoint", ["generate", "generate_stream"])
@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            '{"text_input": "hi", "max_tokens": 1, "text_input": "again"}',
            "input 'text_input' already exists in request",
        ),
        (
            '{"text_input": "hi", "max_tokens": 1, "max_tokens": 2, "text_input": "a"}',
            "input 'max_tokens' already",
        ),
        ('{"text_input": "hi", "text_\\u0069nput": "x"}', "input 'text_input' already exists in request"),
        ('{"text_input": 123}', "attempt to access JSON non-string as string"),
        (
            '{"text_input": "hi", "max_tokens": "1"}',
            "attempt to access JSON non-signed-integer as signed-integer",
        ),
    ],
)
def test_an_input_named_twice_or_of_the_wrong_json_type_is_refused_in_triton_words(
    server: ServerProcess, endpoint: str, body: str, message: str
) -> None:
    """Triton's QA (L0_http generate_endpoint_test); a JSON parser kept the later of two names."""
    status, document = _post(server, body, endpoint)
    assert status == 400 and message in document["error"]


def test_a_stream_whose_first_response_is_an_error_is_that_error_as_an_event(server: ServerProcess) -> None:
    """As Triton's: it was a JSON error (a refusal before the model is one still, above)."""
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/repeat/generate_stream",
        data=json.dumps({"text_input": "hi", "fail": True}).encode(),
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=30)
    with info.value as error:
        assert error.code == 500  # (TritonError's code: INTERNAL; Triton 2.51 answers 400 whatever it is)
        assert error.headers["Content-Type"] == "text/event-stream; charset=utf-8"
        assert error.read() == b'data: {"error":"An Error Occurred"}\n\n'
