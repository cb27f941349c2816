"""The generate extension's bodies: floats as Triton reads and writes them in JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest

from coreserve.config.signature import TensorSpec
from coreserve.errors import InvalidArgumentError
from coreserve.protocol.generate import encode_generate_response, parse_generate_document
from coreserve.types import DataType, InferenceResponse


def test_non_finite_and_single_floats_are_written_as_triton_writes_them() -> None:
    response = InferenceResponse(
        model_name="m",
        model_version="1",
        outputs={
            "many": np.array([np.nan, -np.inf, 0.5], np.float32),
            "one": np.array([np.inf], np.float32),
            "tenth": np.array([0.1], np.float32),
        },
    )
    assert encode_generate_response(response) == (
        b'{"many":[NaN,-Infinity,0.5],"model_name":"m","model_version":"1","one":Infinity,'
        b'"tenth":0.10000000149011612}'
    )


def test_parameters_are_fields_of_their_own_and_every_name_is_sorted_as_on_triton() -> None:
    response = InferenceResponse(
        model_name="m",
        model_version="2",
        outputs={"text_output": np.array([b"hi"], np.object_), "Z": np.array([1], np.int32)},
        id="r7",
        parameters={"finish": "stop", "count": 3, "text_output": "hidden"},
    )
    assert encode_generate_response(response) == (
        b'{"Z":1,"count":3,"finish":"stop","id":"r7","model_name":"m","model_version":"2",'
        b'"text_output":"hidden"}'
    )


def test_non_finite_numbers_in_a_generate_request_are_read() -> None:
    specs = {"x": TensorSpec("x", DataType.FP32, (2,))}
    document = parse_generate_document(b'{"x": [NaN, -Infinity], "temperature": Infinity}', specs, False)
    request = document.request("m", "")
    np.testing.assert_array_equal(request.inputs["x"], np.array([np.nan, -np.inf], np.float32))
    assert request.parameters == {"temperature": float("inf")}


@pytest.mark.parametrize(
    ("dims", "batching", "values", "shape"),
    [
        ((1,), False, "5", (1,)),
        ((1,), True, "5", (1, 1)),
        ((1,), True, "[1, 2, 3]", (3, 1)),  # a batch of three rows
        ((2,), True, "[1, 2, 3, 4]", (2, 2)),
        ((-1,), True, "[1, 2, 3]", (1, 3)),  # the innermost variable dimension takes them
        ((-1, -1), False, "[1, 2, 3]", (1, 3)),
        ((-1, 2), False, "[1, 2, 3, 4]", (2, 2)),
        ((-1,), False, "[]", (0,)),
    ],
)
def test_a_generate_input_takes_the_shape_triton_gives_it(
    dims: tuple[int, ...], batching: bool, values: str, shape: tuple[int, ...]
) -> None:
    # Triton 2.51 fits the values to the input's metadata shape ([-1, *dims] where the model
    # batches): fixed dimensions first, then the innermost variable one (src/http_server.cc).
    specs = {"x": TensorSpec("x", DataType.INT32, dims)}
    document = parse_generate_document(f'{{"x": {values}}}'.encode(), specs, batching)
    assert document.inputs["x"].shape == shape
    parsed = json.loads(values)
    assert document.inputs["x"].ravel().tolist() == (parsed if isinstance(parsed, list) else [parsed])


@pytest.mark.parametrize(
    ("dims", "batching", "values"),
    [((1,), False, "[1, 2]"), ((2,), True, "[1, 2, 3]"), ((2, 2), False, "[1, 2]"), ((1,), False, "[]")],
)
def test_values_that_do_not_fit_a_generate_input_are_refused_in_triton_words(
    dims: tuple[int, ...], batching: bool, values: str
) -> None:
    specs = {"x": TensorSpec("x", DataType.INT32, dims)}
    with pytest.raises(
        InvalidArgumentError, match=r"^The schema can not convert input 'x' to tensor with proper shape"
    ):
        parse_generate_document(f'{{"x": {values}}}'.encode(), specs, batching)
