"""Fuzzing the HTTP body codecs: v2 JSON bodies, Triton's binary extension and raw bodies.

Each test feeds the pure decode functions (what the HTTP frontend calls on a request body)
with generated input and asserts the suite's property (see fuzz_support): a client error
or a request that the rest of the request path can check and answer.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import numpy as np
from hypothesis import example, given
from hypothesis import strategies as st

from coreserve.config.signature import TensorSpec
from coreserve.protocol.bytes_codec import encode_bytes_tensor
from coreserve.protocol.http_body import decode_infer_request, decode_raw_infer_request, encode_infer_response
from coreserve.types import NUMPY_DTYPES, DataType, InferenceRequest, InferenceResponse
from fuzz_support import SIMPLE, DATATYPES, client_error_or_answer, edge_integers, json_values, valid_tensors

def _binary_form(datatype: DataType, shape: list[int], values: list[Any]) -> bytes:
    if datatype is DataType.BYTES:
        array = np.empty(len(values), dtype=np.object_)
        array[:] = [value.encode() for value in values]
        return encode_bytes_tensor(array)
    return np.array(values, dtype=NUMPY_DTYPES[datatype]).tobytes()


@st.composite
def near_valid_bodies(draw: st.DrawFn) -> tuple[bytes, int | None]:
    """A valid v2 request body (JSON, or JSON + binary data), then up to three mutations."""
    inputs: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    for index in range(draw(st.integers(1, 3))):
        datatype, shape, values = draw(valid_tensors())
        item: dict[str, Any] = {"name": f"INPUT{index}", "datatype": datatype.value, "shape": shape}
        if draw(st.booleans()):
            data = _binary_form(datatype, shape, values)
            item["parameters"] = {"binary_data_size": len(data)}
            chunks.append(data)
        else:
            item["data"] = values
        inputs.append(item)
    document: dict[str, Any] = {"inputs": inputs}
    if draw(st.booleans()):
        document["outputs"] = [{"name": "OUTPUT0", "parameters": {"binary_data": draw(st.booleans())}}]
    if draw(st.booleans()):
        document["id"] = draw(st.text(max_size=4))
    binary = b"".join(chunks)
    header_length: int | None = None

    for _ in range(draw(st.integers(0, 3))):
        target = draw(st.sampled_from(inputs))
        kind = draw(
            st.sampled_from(
                [
                    "datatype",
                    "shape",
                    "data",
                    "binary_data_size",
                    "parameters",
                    "request_parameters",
                    "outputs",
                    "id",
                    "drop_key",
                    "duplicate",
                    "binary_tail",
                    "header_length",
                    "inputs",
                ]
            )
        )
        if kind == "datatype":
            target["datatype"] = draw(st.sampled_from(DATATYPES).map(str) | json_values | st.just("int32"))
        elif kind == "shape":
            target["shape"] = draw(
                st.lists(edge_integers, max_size=5)
                | st.lists(st.just(1), min_size=60, max_size=70)
                | st.lists(st.sampled_from([0, 2**40]), min_size=2, max_size=3)
                | json_values
            )
        elif kind == "data":
            target["data"] = draw(
                json_values
                | st.lists(edge_integers, max_size=20)
                | st.lists(st.lists(st.integers(0, 9), max_size=3), max_size=4)  # ragged nesting
                | st.lists(st.floats() | st.text(max_size=3) | st.none(), max_size=6)
            )
        elif kind == "binary_data_size":
            if not isinstance(target.get("parameters"), dict):
                target["parameters"] = {}
            target["parameters"]["binary_data_size"] = draw(
                edge_integers | st.booleans() | st.floats() | st.text(max_size=3)
            )
        elif kind == "parameters":
            target["parameters"] = draw(json_values)
        elif kind == "request_parameters":
            document["parameters"] = draw(
                json_values | st.fixed_dictionaries({"binary_data_output": json_values})
            )
        elif kind == "outputs":
            document["outputs"] = draw(
                json_values
                | st.lists(
                    st.fixed_dictionaries({"name": json_values, "parameters": json_values}), max_size=3
                )
            )
        elif kind == "id":
            document["id"] = draw(json_values)
        elif kind == "drop_key":
            target.pop(draw(st.sampled_from(["name", "datatype", "shape", "data", "parameters"])), None)
        elif kind == "duplicate":
            inputs.append(copy.deepcopy(target))
        elif kind == "binary_tail":
            cut = draw(st.integers(0, len(binary)))
            binary = binary[:cut] + draw(st.binary(max_size=16))
        elif kind == "inputs":
            document["inputs"] = draw(json_values)
        header = json.dumps(document).encode()
        if kind == "header_length":
            header_length = draw(st.sampled_from([0, -1, len(header) - 1, len(header) + 1]) | edge_integers)

    header = json.dumps(document).encode()
    if header_length is None and binary:
        header_length = len(header)
    return header + binary, header_length


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
@example((b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [0, 1099511627776, 1099511627776], "data": []}]}', None))
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
