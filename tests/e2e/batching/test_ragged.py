"""Ragged batching end to end: a real ONNX model that takes a batch without padding.

The model (tests/model_builders.ragged_sum_model) gets every request's elements concatenated
into one flat INPUT and the accumulated element count after each request in INDEX (a
`batch_input`), as a BERT-style model without padding would; it returns each request's sum
(one row per request) and 2 * INPUT flat, which a `batch_output` scatters back in the shape of
each request's INPUT. Requests of different lengths are sent together, the dynamic batcher
runs them as one execution (the statistics say so), and each client gets exactly its own part.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from coreserve.testing import ServerFactory, ServerProcess
from support.model_builders import ragged_sum_model, write_model

CONFIG = """
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
batch_input [ { kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "INDEX" data_type: TYPE_INT32
                source_input: "INPUT" } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "DOUBLED" data_type: TYPE_FP32 dims: [ -1 ] } ]
batch_output [ { target_name: "DOUBLED" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "INPUT" } ]
dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 5000000 }
"""
LENGTHS = [3, 7, 1, 5]  # four requests, one batch


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("ragged")
    write_model(repository, "ragged_sum", ragged_sum_model(), CONFIG)
    process = ServerProcess([repository])
    try:
        process.start(timeout=120)
        yield process
        log = process.log
    finally:
        process.close()
    assert "Traceback" not in log, log


def _inputs(values: np.ndarray) -> list[httpclient.InferInput]:
    tensor = httpclient.InferInput("INPUT", list(values.shape), "FP32")
    tensor.set_data_from_numpy(values)
    return [tensor]


def _executions(client: httpclient.InferenceServerClient) -> tuple[int, int]:
    stats = client.get_inference_statistics("ragged_sum")["model_stats"][0]
    return stats["inference_count"], stats["execution_count"]


def test_requests_of_different_lengths_run_as_one_batch_and_each_gets_its_own_part(
    server: ServerProcess,
) -> None:
    rows = [
        np.arange(1, n + 1, dtype=np.float32).reshape(1, n) * (index + 1) for index, n in enumerate(LENGTHS)
    ]
    with httpclient.InferenceServerClient(
        server.http_url, concurrency=len(rows), network_timeout=60
    ) as client:
        before = _executions(client)
        pending = [client.async_infer("ragged_sum", _inputs(values)) for values in rows]
        results = [request.get_result() for request in pending]
        after = _executions(client)
    for values, result in zip(rows, results, strict=True):
        assert result.as_numpy("SUM").tolist() == [[float(values.sum())]]
        doubled = result.as_numpy("DOUBLED")
        assert doubled.shape == values.shape
        np.testing.assert_array_equal(doubled, 2 * values)
    # Four requests, one execution of the model: the batch was ragged, not four batches of one.
    assert (after[0] - before[0], after[1] - before[1]) == (len(rows), 1)


def test_a_request_alone_is_ragged_too(server: ServerProcess) -> None:
    values = np.array([[2.0, 4.0]], np.float32)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        tensor = grpcclient.InferInput("INPUT", [1, 2], "FP32")
        tensor.set_data_from_numpy(values)
        result = client.infer("ragged_sum", [tensor], client_timeout=30)
    finally:
        client.close()
    assert result.as_numpy("SUM").tolist() == [[6.0]]
    np.testing.assert_array_equal(result.as_numpy("DOUBLED"), 2 * values)


def test_a_batch_input_naming_an_unknown_source_fails_the_model_at_load(
    coreserve_server: ServerFactory, tmp_path: Path
) -> None:
    broken = CONFIG.replace('source_input: "INPUT" } ]\noutput', 'source_input: "TOKENS" } ]\noutput')
    assert broken != CONFIG
    write_model(tmp_path, "ragged_sum", ragged_sum_model(), broken)
    server = coreserve_server(tmp_path, "--exit-on-error=false")
    expected = (
        "model 'ragged_sum': config field 'batch_input[0]': source_input 'TOKENS' is not an input of the "
        "model (inputs: ['INPUT'])"
    )
    with httpclient.InferenceServerClient(server.http_url) as client:
        assert not client.is_model_ready("ragged_sum")
        reasons = {entry["name"]: entry.get("reason", "") for entry in client.get_model_repository_index()}
    assert reasons["ragged_sum"] == expected
    assert "Traceback" not in server.log
