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
        b'{"model_name":"m","model_version":"1","many":[NaN,-Infinity,0.5],"one":Infinity,'
        b'"tenth":0.10000000149011612}'
    )


def test_non_finite_numbers_in_a_generate_request_are_read() -> None:
    specs = {"x": TensorSpec("x", DataType.FP32, (2,))}
    document = parse_generate_document(b'{"x": [NaN, -Infinity], "temperature": Infinity}', specs, False)
    request = document.request("m", "")
    np.testing.assert_array_equal(request.inputs["x"], np.array([np.nan, -np.inf], np.float32))
    assert request.parameters == {"temperature": float("inf")}
