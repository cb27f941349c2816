"""Fuzzing the HTTP body codecs: v2 JSON bodies, Triton's binary extension and raw bodies.

Each test feeds the pure decode functions (what the HTTP frontend calls on a request body)
with generated input and asserts the suite's property (see fuzz_support): a client error
or a request that the rest of the request path can check and answer.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
from hypothesis import example, given
from hypothesis import strategies as st

from coreserve.config.signature import TensorSpec
from coreserve.protocol.http_body import decode_infer_request, decode_raw_infer_request, encode_infer_response
from coreserve.types import DataType, InferenceRequest, InferenceResponse
from fuzz_support import DATATYPES, SIMPLE, client_error_or_answer, edge_integers, near_valid_bodies


def _answer(request: InferenceRequest, encoding: Any) -> None:
    """What the server does with a decoded request: checks it and encodes an answer."""
    client_error_or_answer(lambda: SIMPLE.check_request(copy.copy(request)))
    echo = InferenceResponse(model_name="m", model_version="1", outputs=dict(request.inputs), id=request.id)
    client_error_or_answer(lambda: encode_infer_response(echo, encoding))


@given(body=st.binary(max_size=256), header_length=st.none() | edge_integers)
@example(body=b"", header_length=None)
@example(body=b"[]", header_length=None)
@example(body=b'{"inputs": [{}]}', header_length=None)
def test_random_bytes_get_a_client_error_or_a_request(body: bytes, header_length: int | None) -> None:
    decoded = client_error_or_answer(lambda: decode_infer_request(body, header_length, "m", "1"))
    if decoded is not None:
        _answer(*decoded)


@given(near_valid_bodies())
@example(
    (
        b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [0, 1099511627776, 1099511627776], "data": []}]}',
        None,
    )
)
def test_near_valid_bodies_get_a_client_error_or_a_request(case: tuple[bytes, int | None]) -> None:
    body, header_length = case
    decoded = client_error_or_answer(lambda: decode_infer_request(body, header_length, "m", "1"))
    if decoded is not None:
        request, encoding = decoded
        for array in request.inputs.values():
            assert isinstance(array, np.ndarray)
        _answer(request, encoding)


@st.composite
def raw_cases(draw: st.DrawFn) -> tuple[TensorSpec, bool, bytes]:
    datatype = draw(st.sampled_from(DATATYPES))
    dims = tuple(draw(st.lists(st.sampled_from([-1, 1, 2, 3, 4, 2**40]), max_size=4)))
    return TensorSpec("RAW", datatype, dims), draw(st.booleans()), draw(st.binary(max_size=64))


@given(raw_cases())
@example((TensorSpec("RAW", DataType.BOOL, (-1, 2**40, 2**40)), False, b""))
@example((TensorSpec("RAW", DataType.BYTES, (1,) * 64), True, b"x"))
def test_raw_bodies_get_a_client_error_or_a_request(case: tuple[TensorSpec, bool, bytes]) -> None:
    spec, batching, body = case
    decoded = client_error_or_answer(lambda: decode_raw_infer_request(body, spec, batching, "m", "1"))
    if decoded is not None:
        request, _ = decoded
        assert request.inputs["RAW"].dtype == spec.datatype.numpy_dtype
