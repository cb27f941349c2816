"""Ensembles: the example pipeline, a diamond with parallel branches, failures, invalid
graphs, batching inside a composing model, and a decoupled step streaming out."""

from __future__ import annotations

import queue
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerProcess
from support.model_builders import add_sub_model, write_model
from support.paths import TESTS

HERE = Path(__file__).resolve().parent
PYTHON_MODELS = TESTS / "plugins" / "python" / "models"
ADD_SUB = """
backend: "onnxruntime"
max_batch_size: 16
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching { max_queue_delay_microseconds: 300000 }
"""


def _step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    maps = "".join(f' input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    maps += "".join(f' output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: -1{maps} }}'


def _ensemble(
    repository: Path,
    name: str,
    inputs: str,
    outputs: str,
    steps: list[str],
    extra: str = "",
    max_batch: int = 0,
) -> None:
    folder = repository / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(
        f'platform: "ensemble"\nmax_batch_size: {max_batch}\ninput [ {inputs} ]\noutput [ {outputs} ]\n'
        f"ensemble_scheduling {{ step [ {', '.join(steps)} ] }}\n{extra}"
    )


FP32_4 = "data_type: TYPE_FP32 dims: [ 4 ]"
INVALID = {
    "unknown_model": (
        [_step("nowhere", {"IN": "IN"}, {"OUT": "OUT"})],
        "step 0 (model 'nowhere'): Request for unknown model: 'nowhere' is not found",
    ),
    "unproduced_tensor": (
        [_step("join", {"X": "IN", "Y": "ghost"}, {"SUM": "OUT"})],
        "step 0 (model 'join') input 'Y' reads tensor 'ghost', which no step produces",
    ),
    "unused_output": (
        [_step("branch_a", {"IN": "IN"}, {"OUT": "OUT", "SPAN": "span"})],
        "step 0 (model 'branch_a') output 'SPAN' (tensor 'span') is neither read by a step nor an ensemble output",
    ),
    "cycle": (
        [
            _step("join", {"X": "IN", "Y": "b"}, {"SUM": "a"}),
            _step("join", {"X": "a", "Y": "IN"}, {"SUM": "b"}),
            _step("branch_a", {"IN": "a"}, {"OUT": "OUT"}),
        ],
        "steps form a cycle",
    ),
    # Ensembles that use each other: neither loads (each said "unknown model" before).
    "uses_b": (
        [_step("uses_a", {"IN": "IN"}, {"OUT": "OUT"})],
        "circular dependency between ensembles: uses_b -> uses_a -> uses_b",
    ),
    "uses_a": (
        [_step("uses_b", {"IN": "IN"}, {"OUT": "OUT"})],
        "circular dependency between ensembles: uses_a -> uses_b -> uses_a",
    ),
    "datatype_mismatch": (
        [_step("double", {"VALUE": "IN"}, {"DOUBLED": "OUT"})],
        "step 0 (model 'double') input 'VALUE' (tensor 'IN') expects INT32 [1], but ensemble input 'IN' gives FP32 [4]",
    ),
    "unmapped_input": (
        [_step("join", {"X": "IN"}, {"SUM": "OUT"})],
        "step 0 (model 'join') input 'Y' is not mapped",
    ),
}
INT32_1 = "data_type: TYPE_INT32 dims: [ 1 ]"
DECOUPLED_STEP = (
    [_step("countdown", {"N": "IN"}, {"VALUE": "OUT"})],
    "step 0 (model 'countdown') is decoupled",
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("ensembles")
    for folder in HERE.joinpath("ensemble_models").iterdir():
        shutil.copytree(folder, repository / folder.name)
    for name in ("failing", "countdown"):
        shutil.copytree(PYTHON_MODELS / name, repository / name)
    write_model(repository, "add_sub", add_sub_model("FP32", ["batch", 4]), ADD_SUB)
    io = f'{{ name: "IN" {FP32_4} }}'
    _ensemble(
        repository,
        "diamond",
        io,
        f'{{ name: "OUT" {FP32_4} }}, {{ name: "SPAN_A" data_type: TYPE_FP64 dims: [ 2 ] }}, '
        f'{{ name: "SPAN_B" data_type: TYPE_FP64 dims: [ 2 ] }}',
        [
            _step("branch_a", {"IN": "IN"}, {"OUT": "a", "SPAN": "SPAN_A"}),
            _step("branch_b", {"IN": "IN"}, {"OUT": "b", "SPAN": "SPAN_B"}),
            _step("join", {"X": "a", "Y": "b"}, {"SUM": "OUT"}),
        ],
    )
    _ensemble(
        repository,
        "with_failing_step",
        '{ name: "MODE" data_type: TYPE_STRING dims: [ 1 ] }',
        '{ name: "OK" data_type: TYPE_BOOL dims: [ 1 ] }',
        [_step("failing", {"MODE": "MODE"}, {"OK": "OK"})],
    )
    _ensemble(
        repository,
        "batched",
        f'{{ name: "A" {FP32_4} }}, {{ name: "B" {FP32_4} }}',
        f'{{ name: "SUM" {FP32_4} }}',
        [_step("add_sub", {"INPUT0": "A", "INPUT1": "B"}, {"OUTPUT0": "SUM"})],
        max_batch=8,
    )
    _ensemble(
        repository,
        "streaming",
        '{ name: "N" data_type: TYPE_INT32 dims: [ 1 ] }',
        '{ name: "DOUBLED" data_type: TYPE_INT32 dims: [ 1 ] }',
        [
            _step("countdown", {"N": "N"}, {"VALUE": "value"}),
            _step("double", {"VALUE": "value"}, {"DOUBLED": "DOUBLED"}),
        ],
        extra="model_transaction_policy { decoupled: true }",
    )
    for name, (steps, _) in INVALID.items():
        _ensemble(repository, name, io, f'{{ name: "OUT" {FP32_4} }}', steps)
    _ensemble(
        repository,
        "decoupled_step",
        f'{{ name: "IN" {INT32_1} }}',
        f'{{ name: "OUT" {INT32_1} }}',
        DECOUPLED_STEP[0],
    )
    process = ServerProcess([repository], ["--exit-on-error=false"]).start(timeout=120)
    yield process
    process.close()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    yield client
    client.close()


def _texts(*texts: str) -> np.ndarray:
    return np.array([[text.encode()] for text in texts], dtype=np.object_)


def test_example_pipeline_over_http_and_grpc(examples_server: ServerProcess) -> None:
    texts = _texts("what a great and wonderful movie", "a boring film")
    http = httpclient.InferenceServerClient(examples_server.http_url)
    grpc = grpcclient.InferenceServerClient(examples_server.grpc_url)
    try:
        tensor = httpclient.InferInput("TEXT", [2, 1], "BYTES")
        tensor.set_data_from_numpy(texts)
        result = http.infer("ensemble_pipeline", [tensor])
        labels, scores = result.as_numpy("LABEL"), result.as_numpy("SCORE")
        assert labels.shape == (2, 1) and set(labels.ravel()) <= {b"positive", b"negative"}
        assert scores.dtype == np.float32 and np.all((scores >= 0.5) & (scores <= 1.0))
        grpc_tensor = grpcclient.InferInput("TEXT", [2, 1], "BYTES")
        grpc_tensor.set_data_from_numpy(texts)
        grpc_result = grpc.infer("ensemble_pipeline", [grpc_tensor])
        assert grpc_result.as_numpy("LABEL").tolist() == labels.tolist()
        np.testing.assert_allclose(grpc_result.as_numpy("SCORE"), scores)
        # The pipeline's score is the classifier's: run the steps by hand and compare.
        step = httpclient.InferInput("TEXT", [2, 1], "BYTES")
        step.set_data_from_numpy(texts)
        tokens = http.infer("preprocess", [step])
        ids = httpclient.InferInput("input_ids", [2, 16], "INT64")
        ids.set_data_from_numpy(tokens.as_numpy("input_ids"))
        mask = httpclient.InferInput("attention_mask", [2, 16], "INT64")
        mask.set_data_from_numpy(tokens.as_numpy("attention_mask"))
        logits = http.infer("text_classifier", [ids, mask]).as_numpy("logits")
        probabilities = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
        np.testing.assert_allclose(scores.ravel(), probabilities.max(axis=1), rtol=1e-5)
        statistics = {s["name"]: s for s in http.get_inference_statistics()["model_stats"]}
        assert statistics["ensemble_pipeline"]["inference_count"] >= 4
        assert statistics["preprocess"]["inference_count"] >= 6  # twice through the pipeline, once by hand
    finally:
        http.close()
        grpc.close()


def test_diamond_branches_run_at_the_same_time(client: httpclient.InferenceServerClient) -> None:
    tensor = httpclient.InferInput("IN", [4], "FP32")
    tensor.set_data_from_numpy(np.arange(4, dtype=np.float32))
    result = client.infer("diamond", [tensor])
    np.testing.assert_array_equal(result.as_numpy("OUT"), np.arange(4, dtype=np.float32) * 5)
    span_a, span_b = result.as_numpy("SPAN_A"), result.as_numpy("SPAN_B")
    # Each 0.5 s branch began before the other ended: they ran side by side (serially, one
    # would begin only after the other's end), however slow the machine.
    assert span_a[0] < span_b[1] and span_b[0] < span_a[1], (
        f"one branch ran after the other: {span_a}, {span_b}"
    )


def test_a_failing_step_names_its_model(client: httpclient.InferenceServerClient) -> None:
    tensor = httpclient.InferInput("MODE", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([b"error"], dtype=np.object_))
    with pytest.raises(InferenceServerException) as info:
        client.infer("with_failing_step", [tensor])
    assert info.value.status() == "400"
    assert (
        "ensemble 'with_failing_step' step 0 (model 'failing') failed: the input is not acceptable"
        in info.value.message()
    )
    tensor.set_data_from_numpy(np.array([b"fine"], dtype=np.object_))
    assert client.infer("with_failing_step", [tensor]).as_numpy("OK").tolist() == [True]


@pytest.mark.parametrize("name", [*INVALID, "decoupled_step"])
def test_invalid_ensembles_are_unavailable_with_reason(
    client: httpclient.InferenceServerClient, name: str
) -> None:
    _, reason = INVALID.get(name, DECOUPLED_STEP)
    assert not client.is_model_ready(name)
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata(name)
    assert info.value.status() == "404"
    assert f"ensemble '{name}': {reason}" in info.value.message()


def test_concurrent_ensemble_requests_are_batched_in_a_composing_model(server: ServerProcess) -> None:
    def call(value: float) -> list[float]:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
        try:
            inputs = [httpclient.InferInput("A", [1, 4], "FP32"), httpclient.InferInput("B", [1, 4], "FP32")]
            inputs[0].set_data_from_numpy(np.full((1, 4), value, np.float32))
            inputs[1].set_data_from_numpy(np.ones((1, 4), np.float32))
            return client.infer("batched", inputs).as_numpy("SUM").ravel().tolist()
        finally:
            client.close()

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(call, range(8)))
    assert results == [[v + 1.0] * 4 for v in range(8)]
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        composing = client.get_inference_statistics("add_sub")["model_stats"][0]
        ensemble = client.get_inference_statistics("batched")["model_stats"][0]
    finally:
        client.close()
    assert ensemble["inference_count"] == 8
    assert composing["inference_count"] == 8 and composing["execution_count"] < 8


def test_a_decoupled_step_streams_out_of_the_ensemble(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=partial(lambda q, result, error: q.put((result, error)), results))
    try:
        tensor = grpcclient.InferInput("N", [1], "INT32")
        tensor.set_data_from_numpy(np.array([3], np.int32))
        client.async_stream_infer("streaming", [tensor], request_id="s", enable_empty_final_response=True)
        values = []
        while True:
            result, error = results.get(timeout=30)
            assert error is None, error
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
            values.append(int(result.as_numpy("DOUBLED")[0]))
    finally:
        client.stop_stream()
        client.close()
    assert values == [6, 4, 2]
