"""Ensembles: the example pipeline, a diamond with parallel branches, failures, invalid
graphs, batching inside a composing model, a decoupled step streaming out, and Triton's rules
for optional and absent tensors, pruned steps, reshapes and the decoupled flag."""

from __future__ import annotations

import queue
import re
import shutil
import urllib.request
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
from support.model_builders import add_sub_model, scale_model, write_model
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
    scheduling: str = "",
) -> None:
    folder = repository / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(
        f'platform: "ensemble"\nmax_batch_size: {max_batch}\ninput [ {inputs} ]\noutput [ {outputs} ]\n'
        f"ensemble_scheduling {{ {scheduling} step [ {', '.join(steps)} ] }}\n{extra}"
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
# Ensembles of other inputs and outputs that do not load: (inputs, outputs, steps, max_batch, reason).
INVALID_OTHERS = {
    "two_decoupled": (
        f'{{ name: "IN" {INT32_1} }}',
        f'{{ name: "OUT" {INT32_1} }}',
        [
            _step("countdown", {"N": "IN"}, {"VALUE": "a"}),
            _step("countdown", {"N": "IN"}, {"VALUE": "b"}),
            _step("pair", {"A": "a", "B": "b"}, {"S": "OUT"}),
        ],
        0,
        "step 2 (model 'pair') receives inputs originated from different decoupled models",
    ),
    "outputs_of_two_decoupled": (
        f'{{ name: "IN" {INT32_1} }}',
        f'{{ name: "OUT" {INT32_1} }}, {{ name: "OUT2" {INT32_1} }}',
        [
            _step("countdown", {"N": "IN"}, {"VALUE": "OUT"}),
            _step("countdown", {"N": "IN"}, {"VALUE": "OUT2"}),
        ],
        0,
        "its outputs originate from different decoupled models",
    ),
    "unused_input": (  # (Triton refuses an input no step reads)
        f'{{ name: "IN" {INT32_1} }}, {{ name: "EXTRA" {INT32_1} }}',
        f'{{ name: "OUT" {INT32_1} }}',
        [_step("double", {"VALUE": "IN"}, {"DOUBLED": "OUT"})],
        0,
        "ensemble input 'EXTRA' is not used",
    ),
    "batches_past_its_step": (
        f'{{ name: "A" {FP32_4} }}, {{ name: "B" {FP32_4} }}',
        f'{{ name: "SUM" {FP32_4} }}',
        [_step("add_sub", {"INPUT0": "A", "INPUT1": "B"}, {"OUTPUT0": "SUM"})],
        32,
        "allows maximum batch size 32, but it contains model add_sub which only allows maximum batch size to be 16",
    ),
}
# Ensembles Triton refuses to load for what they declare besides their steps: (extra, reason).
REFUSED = {
    "with_instance_group": (
        "instance_group [ { kind: KIND_CPU count: 1 } ]",
        "instance group should not be specified for ensemble 'with_instance_group'",
    ),
    "with_warmup": (
        'model_warmup [ { name: "w" batch_size: 1 inputs { key: "IN" value: '
        "{ data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } } ]",
        "model_warmup can not be specified for ensemble 'with_warmup'",
    ),
}
# Adds A and B (100 where B is left out); S2 is B, and left out with it.
PAIR_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "B")
            outputs = [pb_utils.Tensor("S", a + (b.as_numpy() if b is not None else 100))]
            if b is not None:
                outputs.append(pb_utils.Tensor("S2", b.as_numpy()))
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""
PAIR_CONFIG = f"""
backend: "python"
max_batch_size: 0
input [ {{ name: "A" {INT32_1} }}, {{ name: "B" {INT32_1} optional: true }} ]
output [ {{ name: "S" {INT32_1} }}, {{ name: "S2" {INT32_1} }} ]
"""


def _tensor(name: str, spec: str = INT32_1) -> str:
    return f'{{ name: "{name}" {spec} }}'


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
        "limited",
        io,
        f'{{ name: "OUT" {FP32_4} }}',
        [_step("join", {"X": "IN", "Y": "IN"}, {"SUM": "OUT"})],
        scheduling="max_inflight_requests: 2",
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
    _ensemble(
        repository,
        "slow_streaming",
        '{ name: "N" data_type: TYPE_INT32 dims: [ 1 ] }',
        '{ name: "DOUBLED" data_type: TYPE_INT32 dims: [ 1 ] }',
        [
            _step("countdown", {"N": "N"}, {"VALUE": "value"}),
            _step("slow_double", {"VALUE": "value"}, {"DOUBLED": "DOUBLED"}),
        ],
        extra="model_transaction_policy { decoupled: true }",
    )
    for name, (steps, _) in INVALID.items():
        _ensemble(repository, name, io, f'{{ name: "OUT" {FP32_4} }}', steps)
    for name, (extra, _) in REFUSED.items():
        _ensemble(repository, name, io, f'{{ name: "OUT" {FP32_4} }}',
                  [_step("join", {"X": "IN", "Y": "IN"}, {"SUM": "OUT"})], extra=extra)  # fmt: skip
    write_model(repository, "pair", PAIR_MODEL.encode(), PAIR_CONFIG, filename="model.py")
    for name, (inputs, outputs, steps, max_batch, _) in INVALID_OTHERS.items():
        _ensemble(repository, name, inputs, outputs, steps, max_batch=max_batch)
    _ensemble(repository, "undeclared_decoupled", _tensor("IN"), _tensor("OUT"),
              [_step("countdown", {"N": "IN"}, {"VALUE": "OUT"})])  # fmt: skip
    _ensemble(repository, "declared_decoupled", _tensor("IN"), _tensor("OUT"),
              [_step("double", {"VALUE": "IN"}, {"DOUBLED": "OUT"})],
              extra="model_transaction_policy { decoupled: true }")  # fmt: skip
    _ensemble(repository, "optional_input", f'{_tensor("IN")}, {_tensor("MAYBE", INT32_1 + " optional: true")}',
              f'{_tensor("OUT")}, {_tensor("OUT2")}',
              [_step("pair", {"A": "IN", "B": "MAYBE"}, {"S": "OUT", "S2": "OUT2"})])  # fmt: skip
    _ensemble(repository, "two_branches", f'{_tensor("VALUE")}, {_tensor("MODE", "data_type: TYPE_STRING dims: [ 1 ]")}',
              f'{_tensor("DOUBLED")}, {_tensor("OK", "data_type: TYPE_BOOL dims: [ 1 ]")}',
              [_step("double", {"VALUE": "VALUE"}, {"DOUBLED": "DOUBLED"}),
               _step("failing", {"MODE": "MODE"}, {"OK": "OK"})])  # fmt: skip
    square = "data_type: TYPE_FP32 dims: [ 2, 2 ] reshape { shape: [ 4 ] }"
    _ensemble(repository, "reshaped", _tensor("IN", square), _tensor("OUT", square),
              [_step("join", {"X": "IN", "Y": "IN"}, {"SUM": "OUT"})])  # fmt: skip
    # Between models that batch and models that do not, shapes alike but for the batch dimension
    # (Triton loads both; its QA loads the first).
    _ensemble(repository, "unbatched_over_batching", f'{{ name: "A" {FP32_4} }}, {{ name: "B" {FP32_4} }}',
              f'{{ name: "SUM" {FP32_4} }}', [_step("add_sub", {"INPUT0": "A", "INPUT1": "B"}, {"OUTPUT0": "SUM"})])  # fmt: skip
    _ensemble(repository, "batching_over_unbatched", io, f'{{ name: "OUT" {FP32_4} }}',
              [_step("join", {"X": "IN", "Y": "IN"}, {"SUM": "OUT"})], max_batch=4)  # fmt: skip
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


def test_an_ensembles_compute_times_are_the_sums_of_its_steps(
    client: httpclient.InferenceServerClient,
) -> None:
    # As Triton counts them (Model Analyzer reads them): each compute phase of the ensemble is
    # the sum of that phase over the steps its requests ran, in its totals and batch statistics.
    phases = ("compute_input", "compute_infer", "compute_output")
    models = ("diamond", "branch_a", "branch_b", "join")

    def totals() -> dict[str, list[int]]:
        stats = {s["name"]: s for s in client.get_inference_statistics()["model_stats"]}
        return {name: [stats[name]["inference_stats"][phase]["ns"] for phase in phases] for name in models}

    def batch_one() -> list[int]:
        batches = client.get_inference_statistics("diamond")["model_stats"][0]["batch_stats"]
        assert [batch["batch_size"] for batch in batches] in ([], [1])
        return [batches[0][phase]["ns"] if batches else 0 for phase in phases]

    before, batch_before = totals(), batch_one()
    tensor = httpclient.InferInput("IN", [4], "FP32")
    tensor.set_data_from_numpy(np.ones(4, dtype=np.float32))
    for _ in range(2):
        client.infer("diamond", [tensor])
    after = totals()
    grown = {name: [a - b for a, b in zip(after[name], before[name], strict=True)] for name in models}
    steps = [sum(grown[name][phase] for name in models[1:]) for phase in range(3)]
    assert grown["diamond"] == steps
    assert grown["diamond"][1] >= 2 * 2 * 500_000_000  # (each branch sleeps 0.5 s)
    assert [a - b for a, b in zip(batch_one(), batch_before, strict=True)] == steps


def test_a_failing_steps_error_is_the_ensembles_in_tritons_words(
    client: httpclient.InferenceServerClient, server: ServerProcess
) -> None:
    def counts() -> tuple[int, int, str]:
        stats = client.get_inference_statistics("with_failing_step")["model_stats"][0]
        failures = re.findall(
            r'^nv_inference_request_failure\{(?=[^}]*model="with_failing_step")[^}]*reason="(\w+)"[^}]*\} (\d+)',
            urllib.request.urlopen(server.metrics_url, timeout=30).read().decode(),
            re.M,
        )
        failed = ",".join(reason for reason, count in failures if count != "0")
        return stats["execution_count"], stats["inference_stats"]["fail"]["count"], failed

    def step_counts() -> tuple[int, int]:
        stats = client.get_inference_statistics("failing")["model_stats"][0]["inference_stats"]
        return stats["success"]["count"], stats["fail"]["count"]

    executions, fails, _ = counts()
    successes, step_fails = step_counts()
    tensor = httpclient.InferInput("MODE", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([b"error"], dtype=np.object_))
    with pytest.raises(InferenceServerException) as info:
        client.infer("with_failing_step", [tensor])
    assert info.value.status() == "400"
    assert info.value.message() == "in ensemble 'with_failing_step', the input is not acceptable"
    # As Triton counts a failed ensemble request: no execution, and the reason OTHER.
    assert counts() == (executions, fails + 1, "OTHER")
    # The step's error response is a failure of the step (Triton 2.51 counts it a success).
    assert step_counts() == (successes, step_fails + 1)
    tensor.set_data_from_numpy(np.array([b"fine"], dtype=np.object_))
    assert client.infer("with_failing_step", [tensor]).as_numpy("OK").tolist() == [True]
    assert counts()[0] == executions + 1


@pytest.mark.parametrize("name", [*INVALID, *INVALID_OTHERS])
def test_invalid_ensembles_are_unavailable_with_reason(
    client: httpclient.InferenceServerClient, name: str
) -> None:
    reason = INVALID[name][1] if name in INVALID else INVALID_OTHERS[name][-1]
    assert not client.is_model_ready(name)
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata(name)
    assert info.value.status() == "404"
    assert f"ensemble '{name}': {reason}" in info.value.message()


@pytest.mark.parametrize("name", REFUSED)
def test_ensembles_with_instances_or_warmup_are_refused_in_tritons_words(
    client: httpclient.InferenceServerClient, name: str
) -> None:
    assert not client.is_model_ready(name)
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata(name)
    assert REFUSED[name][1] in info.value.message()


def test_an_ensembles_configuration_reads_as_on_triton(client: httpclient.InferenceServerClient) -> None:
    # No backend, no instance group, no optimization, and always a transaction policy.
    config = client.get_model_config("diamond")
    assert (config["platform"], config["backend"], config["instance_group"]) == ("ensemble", "", [])
    assert "optimization" not in config
    assert config["model_transaction_policy"] == {"decoupled": False}
    assert client.get_model_config("streaming")["model_transaction_policy"] == {"decoupled": True}
    assert client.get_model_metadata("diamond")["platform"] == "ensemble"


def test_an_ensemble_with_max_inflight_requests_says_so_as_triton(server: ServerProcess) -> None:
    """Triton's QA L0_simple_ensemble looks for its log line."""
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        tensor = httpclient.InferInput("IN", [4], "FP32")
        tensor.set_data_from_numpy(np.arange(4, dtype=np.float32))
        assert client.infer("limited", [tensor]).as_numpy("OUT").tolist() == [0.0, 2.0, 4.0, 6.0]
    finally:
        client.close()
    assert "Ensemble model 'limited' configured with max_inflight_requests: 2" in server.log
    assert "Ensemble model 'diamond' configured" not in server.log


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


def _streamed(
    server: ServerProcess, model: str, name: str, value: int, output: str, empty_final: bool = True
) -> list[tuple[int | None, bool]]:
    """A decoupled model's responses to one request over a gRPC stream, up to the final flag:
    each one's value (None: no output) and its final flag."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=partial(lambda q, result, error: q.put((result, error)), results))
    try:
        tensor = grpcclient.InferInput(name, [1], "INT32")
        tensor.set_data_from_numpy(np.array([value], np.int32))
        client.async_stream_infer(model, [tensor], request_id="s", enable_empty_final_response=empty_final)
        responses = []
        while True:
            result, error = results.get(timeout=30)
            assert error is None, error
            final = result.get_response().parameters["triton_final_response"].bool_param
            values = result.as_numpy(output)
            responses.append((None if values is None else int(values[0]), final))
            if final:
                return responses
    finally:
        client.stop_stream()
        client.close()


def _values(responses: list[tuple[int | None, bool]]) -> list[int]:
    """The values streamed, up to and with the final flag (alone, or on the last value)."""
    assert responses[-1][1] and not any(final for _, final in responses[:-1])
    return [value for value, _ in responses if value is not None]


def test_a_decoupled_step_streams_out_of_the_ensemble(server: ServerProcess) -> None:
    assert _values(_streamed(server, "streaming", "N", 3, "DOUBLED")) == [6, 4, 2]


@pytest.mark.parametrize("empty_final", [True, False], ids=["empty-final-asked", "not-asked"])
def test_the_final_flag_rides_on_the_response_that_finds_the_pipeline_drained(
    server: ServerProcess, empty_final: bool
) -> None:
    """As Triton 2.51 answers (checked side by side): a step slower than the decoupled one's
    final flag has it arrive before the last value has gone through, so the last response
    carries it, and a client that asks for no empty final response still sees it."""
    responses = _streamed(server, "slow_streaming", "N", 3, "DOUBLED", empty_final=empty_final)
    assert responses == [(6, False), (4, False), (2, True)]


def _int32(name: str, value: int) -> httpclient.InferInput:
    tensor = httpclient.InferInput(name, [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], np.int32))
    return tensor


def test_an_optional_input_left_out_and_an_output_a_step_left_out_are_absent(
    client: httpclient.InferenceServerClient,
) -> None:
    """As Triton: the step runs without the input the request left out, and the response
    holds the outputs that were produced."""
    result = client.infer("optional_input", [_int32("IN", 1)])
    assert result.as_numpy("OUT").tolist() == [101] and result.as_numpy("OUT2") is None
    given = client.infer("optional_input", [_int32("IN", 1), _int32("MAYBE", 5)])
    assert given.as_numpy("OUT").tolist() == [6] and given.as_numpy("OUT2").tolist() == [5]


def test_only_the_steps_the_requested_outputs_need_run(client: httpclient.InferenceServerClient) -> None:
    mode = httpclient.InferInput("MODE", [1], "BYTES")
    mode.set_data_from_numpy(np.array([b"error"], dtype=np.object_))
    before = client.get_inference_statistics("failing")["model_stats"][0]["inference_stats"]
    asked = [httpclient.InferRequestedOutput("DOUBLED")]
    result = client.infer("two_branches", [_int32("VALUE", 4), mode], outputs=asked)
    assert result.as_numpy("DOUBLED").tolist() == [8] and result.as_numpy("OK") is None
    after = client.get_inference_statistics("failing")["model_stats"][0]["inference_stats"]
    assert after == before  # the failing branch was pruned: it never ran
    with pytest.raises(
        InferenceServerException, match="in ensemble 'two_branches', the input is not acceptable"
    ):
        client.infer("two_branches", [_int32("VALUE", 4), mode])  # every output: both branches run


def test_the_decoupled_flag_is_the_steps_as_triton_sets_it(
    client: httpclient.InferenceServerClient, server: ServerProcess
) -> None:
    declared = client.get_model_config("declared_decoupled")
    assert declared.get("model_transaction_policy", {}).get("decoupled", False) is False
    assert client.infer("declared_decoupled", [_int32("IN", 3)]).as_numpy("OUT").tolist() == [6]
    undeclared = client.get_model_config("undeclared_decoupled")
    assert undeclared["model_transaction_policy"]["decoupled"] is True
    assert _values(_streamed(server, "undeclared_decoupled", "IN", 2, "OUT")) == [2, 1]


def test_an_ensemble_input_and_output_reshaped_as_its_steps_see_them(
    client: httpclient.InferenceServerClient,
) -> None:
    tensor = httpclient.InferInput("IN", [2, 2], "FP32")
    tensor.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(2, 2))
    result = client.infer("reshaped", [tensor]).as_numpy("OUT")
    np.testing.assert_array_equal(result, 2 * np.arange(4, dtype=np.float32).reshape(2, 2))


def test_the_decoupled_flag_is_the_steps_without_completion_too(tmp_path: Path) -> None:
    shutil.copytree(PYTHON_MODELS / "countdown", tmp_path / "countdown")
    _ensemble(tmp_path, "undeclared_decoupled", _tensor("IN"), _tensor("OUT"),
              [_step("countdown", {"N": "IN"}, {"VALUE": "OUT"})])  # fmt: skip
    server = ServerProcess([tmp_path], ["--disable-auto-complete-config"]).start(timeout=120)
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        assert (
            client.get_model_config("undeclared_decoupled")["model_transaction_policy"]["decoupled"] is True
        )
    finally:
        client.close()
        server.close()


def test_a_batch_of_one_is_added_or_taken_off_between_batching_and_unbatched_models(
    client: httpclient.InferenceServerClient,
) -> None:
    """As Triton's ensemble scheduler fits such a tensor to its consumer (`ReshapeTensorDims`)."""
    values = np.arange(4, dtype=np.float32)
    inputs = [httpclient.InferInput(name, [4], "FP32") for name in ("A", "B")]
    for tensor in inputs:
        tensor.set_data_from_numpy(values)
    result = client.infer("unbatched_over_batching", inputs).as_numpy("SUM")
    np.testing.assert_array_equal(result, 2 * values)  # [4] in, [1, 4] through add_sub, [4] out
    batched = httpclient.InferInput("IN", [1, 4], "FP32")
    batched.set_data_from_numpy(values[np.newaxis])
    result = client.infer("batching_over_unbatched", [batched]).as_numpy("OUT")
    np.testing.assert_array_equal(result, 2 * values[np.newaxis])  # [1, 4] in, [4] through join
    metadata = client.get_model_metadata("unbatched_over_batching")
    assert [tensor["shape"] for tensor in metadata["outputs"]] == [[4]]


SCALED = """
backend: "onnxruntime"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
version_policy: { all: {} }
"""


def test_a_step_that_names_no_version_calls_the_latest(tmp_path: Path) -> None:
    """`model_version` left out, 0 or negative: the step's latest version, as -1 is in Triton (where
    Triton 2.51 takes 0 as version 0 and refuses the ensemble: `docs/triton-differences.md`)."""
    for version, factor in ((1, 10.0), (2, 20.0)):
        write_model(tmp_path, "scaled", scale_model(factor), SCALED, versions=(version,))
    io = f'{{ name: "IN" {FP32_4} }}', f'{{ name: "OUT" {FP32_4} }}'
    versions = {"left_out": "", "zero": "model_version: 0", "latest": "model_version: -1",
                "minus_five": "model_version: -5", "one": "model_version: 1"}  # fmt: skip
    for name, version in versions.items():
        step = f'{{ model_name: "scaled" {version} input_map {{ key: "INPUT0" value: "IN" }} '
        step += 'output_map { key: "OUTPUT0" value: "OUT" } }'
        _ensemble(tmp_path, name, *io, [step], max_batch=4)
    server = ServerProcess([tmp_path]).start(timeout=120)
    try:
        with httpclient.InferenceServerClient(server.http_url) as client:
            tensor = httpclient.InferInput("IN", [1, 4], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
            answers = {name: client.infer(name, [tensor]).as_numpy("OUT")[0, 0] for name in versions}
    finally:
        server.close()
    assert answers == {"left_out": 20.0, "zero": 20.0, "latest": 20.0, "minus_five": 20.0, "one": 10.0}
