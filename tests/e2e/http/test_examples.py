"""The example repository through tritonclient.http, as a Triton user's script would use it."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


def test_health_and_server_metadata(examples_client: httpclient.InferenceServerClient) -> None:
    assert examples_client.is_server_live()
    assert examples_client.is_server_ready()
    metadata = examples_client.get_server_metadata()
    assert metadata["name"] == "coreserve"
    assert "binary_tensor_data" in metadata["extensions"]


def test_model_metadata_and_config(examples_client: httpclient.InferenceServerClient) -> None:
    assert examples_client.is_model_ready("simple")
    assert examples_client.is_model_ready("simple", "1")
    metadata = examples_client.get_model_metadata("simple")
    assert metadata["versions"] == ["1"]
    assert metadata["platform"] == "onnxruntime_onnx"
    assert metadata["inputs"] == [
        {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]},
        {"name": "INPUT1", "datatype": "INT32", "shape": [-1, 16]},
    ]
    config = examples_client.get_model_config("text_classifier", "1")
    assert config["max_batch_size"] == 8
    assert config["input"][0]["dims"] == [-1]
    assert config["instance_group"][0]["count"] == 2
    assert config["dynamic_batching"]["preferred_batch_size"] == [4, 8]
    # Filled in as Triton 2.51 fills it (read back by tools such as Model Analyzer).
    optimization = examples_client.get_model_config("simple")["optimization"]
    assert optimization["input_pinned_memory"] == optimization["output_pinned_memory"] == {"enable": True}


def test_auto_completed_config_is_served(examples_client: httpclient.InferenceServerClient) -> None:
    config = examples_client.get_model_config("dense_autocomplete")
    assert config["backend"] == "onnxruntime"
    assert config["platform"] == "onnxruntime_onnx"
    assert config["max_batch_size"] == 4
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("features", "TYPE_FP32", [4])
    ]
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["output"]] == [
        ("scores", "TYPE_FP32", [3])
    ]


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_simple_infer(examples_client: httpclient.InferenceServerClient, binary: bool) -> None:
    """What Triton's simple_http_infer_client.py does."""
    input0 = np.arange(16, dtype=np.int32).reshape(1, 16)
    input1 = np.ones((1, 16), dtype=np.int32)
    inputs = [
        httpclient.InferInput("INPUT0", [1, 16], "INT32"),
        httpclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(input0, binary_data=binary)
    inputs[1].set_data_from_numpy(input1, binary_data=binary)
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary),
    ]
    result = examples_client.infer("simple", inputs, outputs=outputs, request_id="r-17")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), input0 + input1)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), input0 - input1)
    response = result.get_response()
    assert response["id"] == "r-17"
    assert response["model_name"] == "simple"
    assert response["model_version"] == "1"


def test_simple_string_infer(examples_client: httpclient.InferenceServerClient) -> None:
    values = np.array([[str(i).encode() for i in range(16)]], dtype=np.object_)
    ones = np.array([[b"1"] * 16], dtype=np.object_)
    inputs = [
        httpclient.InferInput("INPUT0", [1, 16], "BYTES"),
        httpclient.InferInput("INPUT1", [1, 16], "BYTES"),
    ]
    inputs[0].set_data_from_numpy(values)
    inputs[1].set_data_from_numpy(ones, binary_data=False)
    result = examples_client.infer("simple_string", inputs)
    assert [int(x) for x in result.as_numpy("OUTPUT0").ravel()] == [i + 1 for i in range(16)]
    assert [int(x) for x in result.as_numpy("OUTPUT1").ravel()] == [i - 1 for i in range(16)]


def test_text_classifier_batch(examples_client: httpclient.InferenceServerClient) -> None:
    ids = np.array([[5, 17, 33, 0], [99, 100, 101, 102]], dtype=np.int64)
    mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=np.int64)
    inputs = [
        httpclient.InferInput("input_ids", list(ids.shape), "INT64"),
        httpclient.InferInput("attention_mask", list(mask.shape), "INT64"),
    ]
    inputs[0].set_data_from_numpy(ids)
    inputs[1].set_data_from_numpy(mask)
    logits = examples_client.infer("text_classifier", inputs).as_numpy("logits")
    assert logits.shape == (2, 2) and logits.dtype == np.float32
    # The first row's masked token must not matter.
    ids[0, 3] = 500
    inputs[0].set_data_from_numpy(ids)
    again = examples_client.infer("text_classifier", inputs).as_numpy("logits")
    np.testing.assert_allclose(again, logits, rtol=1e-6)


def test_unknown_model_and_version(examples_client: httpclient.InferenceServerClient) -> None:
    with pytest.raises(
        InferenceServerException, match="Request for unknown model: 'nope' is not found"
    ) as info:
        examples_client.get_model_metadata("nope")
    assert info.value.status() == "404"
    with pytest.raises(
        InferenceServerException, match="Request for unknown model: 'simple' version 7 is not found"
    ) as info:
        examples_client.get_model_metadata("simple", "7")
    assert info.value.status() == "404"
    assert not examples_client.is_model_ready("simple", "7")
