"""Triton's classification extension over HTTP and gRPC, with tritonclient unchanged.

Every expected string below was answered by the real Triton 2.51 to the same model and request
(a python-backend model, compared by hand): the score formatting, the order of ties, labels
from `label_filename` (an index past the file's last line has none), the shapes [B, K] and [K].
"""

from __future__ import annotations

import json
import queue
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerProcess

MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            scores = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", scores),
                pb_utils.Tensor("OUT_INT", scores.astype(np.int32)),
                pb_utils.Tensor("OUT_HALF", scores.astype(np.float16)),
            ]))
        return responses
"""
BATCHED_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 5 ] } ]
output [
  { name: "OUT" data_type: TYPE_FP32 dims: [ 5 ] label_filename: "labels.txt" },
  { name: "OUT_INT" data_type: TYPE_INT32 dims: [ 5 ] },
  { name: "OUT_HALF" data_type: TYPE_FP16 dims: [ 5 ] }
]
"""
FLAT_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]
            )
            for r in requests
        ]
"""
FLAT_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2, 3 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2, 3 ] } ]
"""
WIDE_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
MISSING_LABELS_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 5 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 5 ] label_filename: "nothere.txt" } ]
"""
# Over `scores`: its OUT names no label file (it takes the step's), or one of its own.
ENSEMBLE_CONFIG = """
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 5 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 5 ] %s } ]
ensemble_scheduling { step [ { model_name: "scores" model_version: -1 input_map { key: "IN" value: "IN" }
  output_map { key: "OUT" value: "OUT" } } ] }
"""
TWO_ROWS = np.array([[0.1, 0.5, 0.2, 0.5, 0.05], [3, 2, 1, 0, -1]], dtype=np.float32)
# Triton 2.51's answer for TWO_ROWS with classification 3: ties keep the lower index first,
# index 3 and 4 have no label (labels.txt has three lines).
TWO_ROWS_TOP3 = [
    ["0.500000:1:dog", "0.500000:3", "0.200000:2:bird"],
    ["3.000000:0:cat", "2.000000:1:dog", "1.000000:2:bird"],
]


def _write(repository: Any, name: str, config: str, model: str | None) -> None:
    folder = repository / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(config)
    if model is not None:
        (folder / "1" / "model.py").write_text(model)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("repository")
    _write(repository, "scores", BATCHED_CONFIG, MODEL)
    (repository / "scores" / "labels.txt").write_text("cat\ndog\nbird\n")
    _write(repository, "flat", FLAT_CONFIG, FLAT_MODEL)
    _write(repository, "wide", WIDE_CONFIG, FLAT_MODEL)
    _write(repository, "missing_labels", MISSING_LABELS_CONFIG, FLAT_MODEL)
    _write(repository, "scores_ensemble", ENSEMBLE_CONFIG % "", None)
    _write(repository, "scores_ensemble_own", ENSEMBLE_CONFIG % 'label_filename: "own.txt"', None)
    (repository / "scores_ensemble_own" / "own.txt").write_text("ant\nbee\n")
    process = ServerProcess([repository], ["--exit-on-error=false"]).start()
    yield process
    process.close()


@pytest.fixture
def http(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.http_url)
    yield client
    client.close()


@pytest.fixture
def grpc(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


# Each test leaves no traceback in the server's log (tests/e2e/conftest.py).
pytestmark = pytest.mark.usefixtures("no_traceback")


def _strings(array: np.ndarray) -> list[Any]:
    # tritonclient gives bytes for binary outputs and str for JSON ones.
    return np.vectorize(lambda item: item.decode() if isinstance(item, bytes) else item)(array).tolist()


def _http_infer(
    client: httpclient.InferenceServerClient,
    model: str,
    scores: np.ndarray,
    outputs: list[tuple[str, int]],
    binary: bool = True,
) -> httpclient.InferResult:
    tensor = httpclient.InferInput("IN", list(scores.shape), "FP32")
    tensor.set_data_from_numpy(scores, binary_data=binary)
    requested = [httpclient.InferRequestedOutput(name, binary, class_count=k) for name, k in outputs]
    return client.infer(model, [tensor], outputs=requested)


def _grpc_infer(
    client: grpcclient.InferenceServerClient, model: str, scores: np.ndarray, outputs: list[tuple[str, int]]
) -> grpcclient.InferResult:
    tensor = grpcclient.InferInput("IN", list(scores.shape), "FP32")
    tensor.set_data_from_numpy(scores)
    requested = [grpcclient.InferRequestedOutput(name, class_count=k) for name, k in outputs]
    return client.infer(model, [tensor], outputs=requested)


def _post(server: ServerProcess, model: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/{model}/infer", data=json.dumps(body).encode(), method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _json_request(scores: list[float], parameters: dict[str, Any]) -> dict[str, Any]:
    return {
        "inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, len(scores)], "data": scores}],
        "outputs": [{"name": "OUT", "parameters": parameters}],
    }


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_http_top_classes_of_a_batched_output_per_batch_entry(
    http: httpclient.InferenceServerClient, binary: bool
) -> None:
    result = _http_infer(http, "scores", TWO_ROWS, [("OUT", 3)], binary=binary)
    output = result.get_output("OUT")
    assert output["datatype"] == "BYTES" and output["shape"] == [2, 3]
    assert _strings(result.as_numpy("OUT")) == TWO_ROWS_TOP3


def test_grpc_class_count_gives_the_same_classes(grpc: grpcclient.InferenceServerClient) -> None:
    result = _grpc_infer(grpc, "scores", TWO_ROWS, [("OUT", 3)])
    output = result.get_output("OUT")
    assert output.datatype == "BYTES" and list(output.shape) == [2, 3]
    assert _strings(result.as_numpy("OUT")) == TWO_ROWS_TOP3


def test_other_outputs_of_the_request_stay_tensors(grpc: grpcclient.InferenceServerClient) -> None:
    result = _grpc_infer(grpc, "scores", TWO_ROWS, [("OUT", 1), ("OUT_INT", 0)])
    assert _strings(result.as_numpy("OUT")) == [["0.500000:1:dog"], ["3.000000:0:cat"]]
    assert result.as_numpy("OUT_INT").tolist() == TWO_ROWS.astype(np.int32).tolist()


def test_more_classes_than_the_output_has_gives_all_of_them(http: httpclient.InferenceServerClient) -> None:
    result = _http_infer(http, "scores", TWO_ROWS[:1], [("OUT", 7)])
    assert _strings(result.as_numpy("OUT")) == [
        ["0.500000:1:dog", "0.500000:3", "0.200000:2:bird", "0.100000:0:cat", "0.050000:4"]
    ]


def test_integer_scores_print_as_integers(http: httpclient.InferenceServerClient) -> None:
    scores = np.array([[3, -7, 100, 2, 2]], dtype=np.float32)
    result = _http_infer(http, "scores", scores, [("OUT_INT", 5)])
    assert _strings(result.as_numpy("OUT_INT")) == [["100:2", "3:0", "2:3", "2:4", "-7:1"]]


def test_float_scores_print_with_six_decimals_as_triton(grpc: grpcclient.InferenceServerClient) -> None:
    scores = np.array([[0.1, 0.5, 0.2, 1e-9, 12345.678]], dtype=np.float32)
    result = _grpc_infer(grpc, "scores", scores, [("OUT", 5)])
    assert _strings(result.as_numpy("OUT")) == [
        ["12345.677734:4", "0.500000:1:dog", "0.200000:2:bird", "0.100000:0:cat", "0.000000:3"]
    ]


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_an_output_of_a_model_without_batching_is_flattened(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient, transport: str
) -> None:
    scores = np.array([[0.1, 0.5, 0.2], [0.9, 0.05, 0.7]], dtype=np.float32)
    infer = _http_infer if transport == "http" else _grpc_infer
    result = infer(http if transport == "http" else grpc, "flat", scores, [("OUT", 4)])  # type: ignore[operator]
    assert result.as_numpy("OUT").shape == (4,)
    assert _strings(result.as_numpy("OUT")) == ["0.900000:3", "0.700000:5", "0.500000:1", "0.200000:2"]


def test_an_output_of_a_type_without_order_is_refused_as_triton(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    expected = "class result not available for output due to unsupported type 'FP16'"
    with pytest.raises(InferenceServerException, match=expected) as over_http:
        _http_infer(http, "scores", TWO_ROWS, [("OUT_HALF", 2)])
    assert over_http.value.status() == "400"
    with pytest.raises(InferenceServerException, match=expected) as over_grpc:
        _grpc_infer(grpc, "scores", TWO_ROWS, [("OUT_HALF", 2)])
    assert over_grpc.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_an_output_of_more_than_a_million_scores_is_refused_as_triton(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    """Triton's QA `test_classification_output_tensor_too_large` (its releases after 2.51)."""
    scores = np.zeros(1_000_000, dtype=np.float32)
    scores[123] = 1
    assert _strings(_http_infer(http, "wide", scores, [("OUT", 1)]).as_numpy("OUT")) == ["1.000000:123"]
    wider = np.ones(1_000_001, dtype=np.float32)
    expected = "classification output tensor too large"
    with pytest.raises(InferenceServerException, match=expected) as over_http:
        _http_infer(http, "wide", wider, [("OUT", 1)])
    assert over_http.value.status() == "400"
    with pytest.raises(InferenceServerException, match=expected) as over_grpc:
        _grpc_infer(grpc, "wide", wider, [("OUT", 1)])
    assert over_grpc.value.status() == "StatusCode.INVALID_ARGUMENT"


@pytest.mark.parametrize(
    ("count", "message"),
    [
        (-1, "invalid value for 'classification' parameter, expected >= 1"),
        ("2", "invalid value type for 'classification' parameter, expected an integer"),
        (1.5, "invalid value type for 'classification' parameter, expected an integer"),
        (True, "invalid value type for 'classification' parameter, expected an integer"),
    ],
)
def test_http_a_class_count_that_is_not_a_positive_integer_is_a_400(
    server: ServerProcess, count: Any, message: str
) -> None:
    status, body = _post(
        server, "scores", _json_request([0.1, 0.5, 0.2, 0.3, 0.0], {"classification": count})
    )
    assert status == 400 and body["error"].startswith(message) and "output 'OUT'" in body["error"]


def test_http_classification_zero_asks_for_the_tensor_as_triton_reads_it(server: ServerProcess) -> None:
    status, body = _post(server, "scores", _json_request([0.1, 0.5, 0.2, 0.3, 0.0], {"classification": 0}))
    assert status == 200 and body["outputs"][0]["datatype"] == "FP32"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("int64_param", -2, "invalid value for 'classification' parameter, expected >= 1"),
        ("int64_param", 0, "invalid value for 'classification' parameter, expected >= 1"),
        ("string_param", "2", "invalid value type for 'classification' parameter, expected int64_param"),
        ("double_param", 2.0, "invalid value type for 'classification' parameter, expected int64_param"),
    ],
)
def test_grpc_a_class_count_that_is_not_a_positive_int64_is_invalid_argument(
    grpc: grpcclient.InferenceServerClient, field: str, value: Any, message: str
) -> None:
    tensor = grpcclient.InferInput("IN", [1, 5], "FP32")
    tensor.set_data_from_numpy(TWO_ROWS[:1])
    output = grpcclient.InferRequestedOutput("OUT")
    # tritonclient only sets int64_param (class_count=K): set the raw message as other clients may.
    setattr(output._get_tensor().parameters["classification"], field, value)
    with pytest.raises(InferenceServerException) as info:
        grpc.infer("scores", [tensor], outputs=[output])
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert info.value.message().startswith(message)


def test_a_missing_label_file_makes_the_model_unavailable_with_triton_words(
    http: httpclient.InferenceServerClient,
) -> None:
    index = {entry["name"]: entry for entry in http.get_model_repository_index()}
    entry = index["missing_labels"]
    assert entry["state"] == "UNAVAILABLE"
    assert entry["reason"].startswith("failed to open text file for read ")
    assert "missing_labels/nothere.txt: No such file or directory" in entry["reason"]
    assert index["scores"]["state"] == "READY"


def test_grpc_stream_answers_classes_too(grpc: grpcclient.InferenceServerClient) -> None:
    results: queue.Queue[Any] = queue.Queue()
    grpc.start_stream(callback=lambda result, error: results.put(error or result))
    try:
        tensor = grpcclient.InferInput("IN", [2, 5], "FP32")
        tensor.set_data_from_numpy(TWO_ROWS)
        output = grpcclient.InferRequestedOutput("OUT", class_count=3)
        grpc.async_stream_infer("scores", [tensor], outputs=[output])
        result = results.get(timeout=30)
    finally:
        grpc.stop_stream()
    assert not isinstance(result, InferenceServerException), result
    assert _strings(result.as_numpy("OUT")) == TWO_ROWS_TOP3


def test_an_ensemble_output_without_a_label_file_takes_the_labels_of_the_step_that_makes_it(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    """As Triton's ensembles take them at load (its QA L0_infer classifies ensembles' outputs)."""
    assert (
        _strings(_http_infer(http, "scores_ensemble", TWO_ROWS, [("OUT", 3)]).as_numpy("OUT"))
        == TWO_ROWS_TOP3
    )
    assert (
        _strings(_grpc_infer(grpc, "scores_ensemble", TWO_ROWS, [("OUT", 3)]).as_numpy("OUT"))
        == TWO_ROWS_TOP3
    )
    own = _http_infer(http, "scores_ensemble_own", TWO_ROWS, [("OUT", 2)]).as_numpy("OUT")
    assert _strings(own) == [["0.500000:1:bee", "0.500000:3"], ["3.000000:0:ant", "2.000000:1:bee"]]
