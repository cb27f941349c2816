"""Ragged batching in-process: the batch inputs of each kind, the flat merge, the scatter back,
and the configuration checks of batch_input and batch_output."""

from __future__ import annotations

import numpy as np
import pytest

from coreserve.backend.tensors._ragged import batch_input_value, merge_ragged, split_ragged
from coreserve.config import ModelSignature, apply_defaults, parse_config, validate_config
from coreserve.errors import InternalError, ModelConfigError
from coreserve.protos.model_config_pb2 import BatchInput, DataType
from coreserve.types import InferenceRequest

RAGGED = """
name: "m"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true },
        { name: "FIXED" data_type: TYPE_INT32 dims: [ 2 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "DOUBLED" data_type: TYPE_FP32 dims: [ -1 ] } ]
batch_input [ { kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "INDEX" data_type: TYPE_INT32
                source_input: "INPUT" } ]
batch_output [ { target_name: "DOUBLED" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "INPUT" } ]
"""
# Three requests: batch 1 with 2 elements, batch 2 with 3 each, batch 1 with 4.
SOURCES = [np.zeros((1, 2)), np.zeros((2, 3)), np.zeros((1, 4))]


def _config(text: str):
    config = parse_config(text)
    apply_defaults(config, "m")
    return config


def _requests() -> list[InferenceRequest]:
    requests = []
    for number, source in enumerate(SOURCES):
        values = np.arange(source.size, dtype=np.float32).reshape(source.shape) + 10 * number
        fixed = np.full((source.shape[0], 2), number, np.int32)
        request = InferenceRequest("m", {"INPUT": values, "FIXED": fixed})
        request.batch_size = source.shape[0]
        requests.append(request)
    return requests


@pytest.mark.parametrize(
    ("kind", "datatype", "expected"),
    [
        ("BATCH_ELEMENT_COUNT", DataType.TYPE_INT32, [2, 6, 4]),
        ("BATCH_ACCUMULATED_ELEMENT_COUNT", DataType.TYPE_INT32, [2, 8, 12]),
        ("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", DataType.TYPE_FP32, [0, 2, 8, 12]),
        ("BATCH_ITEM_SHAPE", DataType.TYPE_INT64, [[2], [3], [3], [4]]),
        ("BATCH_ITEM_SHAPE_FLATTEN", DataType.TYPE_INT32, [2, 3, 3, 4]),
    ],
)
def test_each_batch_input_kind_describes_the_batch_as_triton_does(
    kind: str, datatype: int, expected: list
) -> None:
    batch_input = BatchInput(kind=BatchInput.Kind.Value(kind), data_type=datatype, source_input=["INPUT"])
    value = batch_input_value(batch_input, SOURCES)
    np.testing.assert_array_equal(value, np.array(expected))
    assert value.dtype == {DataType.TYPE_INT32: np.int32, DataType.TYPE_FP32: np.float32}.get(
        datatype, np.int64
    )


def test_max_element_count_is_given_as_a_shape() -> None:
    batch_input = BatchInput(
        kind=BatchInput.BATCH_MAX_ELEMENT_COUNT_AS_SHAPE,
        data_type=DataType.TYPE_INT32,
        source_input=["INPUT"],
    )
    assert batch_input_value(batch_input, SOURCES).shape == (6,)


def test_ragged_inputs_merge_flat_and_outputs_scatter_back_to_each_request() -> None:
    signature = ModelSignature(_config(RAGGED))
    requests = _requests()
    merged = merge_ragged(requests, signature)
    np.testing.assert_array_equal(
        merged["INPUT"], np.concatenate([r.inputs["INPUT"].ravel() for r in requests])
    )
    assert merged["FIXED"].shape == (4, 2)  # not ragged: stacked by rows
    np.testing.assert_array_equal(merged["INDEX"], np.array([2, 8, 12], np.int32))
    outputs = {"SUM": np.arange(4, dtype=np.float32).reshape(4, 1), "DOUBLED": 2 * merged["INPUT"]}
    parts = split_ragged(outputs, requests, signature)
    for request, part in zip(requests, parts, strict=True):
        np.testing.assert_array_equal(part["DOUBLED"], 2 * request.inputs["INPUT"])
    assert [part["SUM"].ravel().tolist() for part in parts] == [[0.0], [1.0, 2.0], [3.0]]


def test_a_scattered_output_of_the_wrong_size_fails_the_batch() -> None:
    signature = ModelSignature(_config(RAGGED))
    requests = _requests()
    outputs = {"SUM": np.zeros((4, 1), np.float32), "DOUBLED": np.zeros(11, np.float32)}
    with pytest.raises(
        InternalError, match="returned output 'DOUBLED' with shape \\[11\\]; the batch needs 12"
    ):
        split_ragged(outputs, requests, signature)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            ('source_input: "INPUT" } ]\nbatch_output', 'source_input: "TOKENS" } ]\nbatch_output'),
            "config field 'batch_input[0]': source_input 'TOKENS' is not an input of the model",
        ),
        (
            ("data_type: TYPE_INT32\n", "data_type: TYPE_STRING\n"),
            "config field 'batch_input[0]': data_type of BATCH_ACCUMULATED_ELEMENT_COUNT must be one of "
            "TYPE_FP32, TYPE_INT32",
        ),
        (
            ('target_name: "INDEX"', 'target_name: "FIXED"'),
            "config field 'batch_input[0]': target_name 'FIXED' is already an input that clients send",
        ),
        (
            ('target_name: "DOUBLED"', 'target_name: "TWICE"'),
            "config field 'batch_output[0]': target_name 'TWICE' is not an output of the model",
        ),
        (
            (
                'kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "INPUT"',
                "kind: BATCH_SCATTER_WITH_INPUT_SHAPE",
            ),
            "config field 'batch_output[0]' must name exactly one source_input, got 0",
        ),
        (
            ('target_name: "DOUBLED"', 'target_name: [ "DOUBLED", "DOUBLED" ]'),
            "target output name 'DOUBLED' can only be specified once",  # Triton's words
        ),
    ],
)
def test_batch_inputs_and_outputs_naming_unknown_tensors_are_refused_at_load(
    change: tuple[str, str], message: str
) -> None:
    text = RAGGED.replace(*change)
    assert text != RAGGED
    with pytest.raises(ModelConfigError) as error:
        validate_config(_config(text))
    assert str(error.value).startswith(f"model 'm': {message}")
