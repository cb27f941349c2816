"""The generate extension's bodies: floats as Triton reads and writes them in JSON."""

from __future__ import annotations

import numpy as np

from coreserve.config.signature import TensorSpec
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
