"""The HTTP body codec: JSON and binary tensors in, JSON and binary tensors out."""

from __future__ import annotations

import json
import pickle
import re

import ml_dtypes
import numpy as np
import orjson
import pytest

from coreserve.config.signature import TensorSpec
from coreserve.errors import CoreserveError, InvalidArgumentError
from coreserve.protocol.bytes_codec import decode_bytes_tensor, encode_bytes_tensor
from coreserve.protocol.http_body import (
    GATHER_BYTES,
    JSON_SLICE_ELEMENTS,
    complete_infer_request,
    decode_infer_request,
    decode_raw_infer_request,
    encode_infer_response,
    parse_infer_document,
    split_infer_body,
)
from coreserve.protocol.output_plan import OutputPlan
from coreserve.types import DataType, InferenceResponse


def _decode(document: dict, binary: bytes = b""):
    head = json.dumps(document).encode()
    return decode_infer_request(head + binary, len(head) if binary else None, "m", "")


def test_json_inputs_nested_and_flat() -> None:
    request, encoding = _decode(
        {
            "id": "abc",
            "parameters": {"binary_data_output": True, "priority": 2},
            "inputs": [
                {"name": "a", "shape": [2, 2], "datatype": "INT32", "data": [[1, 2], [3, 4]]},
                {"name": "b", "shape": [3], "datatype": "BOOL", "data": [True, False, True]},
                {"name": "c", "shape": [1], "datatype": "BYTES", "data": ["h\u00e9"]},
                {"name": "d", "shape": [2], "datatype": "FP16", "data": [1, 2.5]},
            ],
            "outputs": [{"name": "x", "parameters": {"binary_data": False}}, {"name": "y"}],
        }
    )
    assert request.id == "abc"
    assert request.parameters == {"priority": 2}
    assert request.requested_outputs == ("x", "y")
    # A listed output is JSON unless it asks for binary data, as in Triton 2.51: the request's
    # binary_data_output counts where the request lists no outputs.
    assert not encoding.is_binary("x") and not encoding.is_binary("y")
    np.testing.assert_array_equal(request.inputs["a"], np.array([[1, 2], [3, 4]], np.int32))
    assert request.inputs["b"].dtype == np.bool_
    assert request.inputs["c"].tolist() == ["h\u00e9".encode()]
    assert request.inputs["d"].dtype == np.float16


def test_aligned_binary_inputs_are_views_of_the_body() -> None:
    a = np.arange(4, dtype=np.float32)
    strings = np.array([b"one", b"", b"three"], dtype=np.object_)
    blob = a.tobytes() + encode_bytes_tensor(strings)
    head = json.dumps(
        {
            "inputs": [
                {"name": "a", "shape": [4], "datatype": "FP32", "parameters": {"binary_data_size": 16}},
                {
                    "name": "s",
                    "shape": [3],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(blob) - 16},
                },
            ]
        }
    ).encode()
    head += b" " * (-len(head) % 8)
    request, _ = decode_infer_request(head + blob, len(head), "m", "")
    np.testing.assert_array_equal(request.inputs["a"], a)
    assert not request.inputs["a"].flags.owndata  # no copy of the body
    assert request.inputs["s"].tolist() == strings.tolist()


@pytest.mark.parametrize("kind", [bytes, bytearray], ids=["one-read", "gathered"])
def test_inputs_from_a_body_are_read_only_whatever_holds_it(kind: type) -> None:
    # A body gathered from several reads is a bytearray: its views must still not let a model
    # write into the request.
    data = np.arange(4, dtype=np.float32).tobytes()
    head = json.dumps(
        {"inputs": [{"name": "a", "shape": [4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}]}
    ).encode()
    head += b" " * (-len(head) % 8)
    request, _ = decode_infer_request(kind(head + data), len(head), "m", "")
    raw, _ = decode_raw_infer_request(kind(data), TensorSpec("a", DataType.FP32, (4,)), False, "m", "")
    for array in (request.inputs["a"], raw.inputs["a"]):
        assert not array.flags.writeable and not array.flags.owndata


def test_unaligned_binary_input_is_copied_aligned() -> None:
    head = b'{"inputs":[{"name":"a","shape":[2],"datatype":"FP64","parameters":{"binary_data_size":16}}]}'
    head += b" " * (1 - len(head) % 8 if len(head) % 8 <= 1 else 9 - len(head) % 8)  # offset 1 mod 8
    assert len(head) % 8 == 1
    body = head + np.array([1.5, 2.5]).tobytes()
    request, _ = decode_infer_request(body, len(head), "m", "")
    assert request.inputs["a"].flags.aligned
    assert request.inputs["a"].tolist() == [1.5, 2.5]


@pytest.mark.parametrize(
    ("data", "datatype", "message"),
    [
        # Triton's words first (http_server.cc, TritonJson), then ours.
        (
            [1.5],
            "INT32",
            "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer",
        ),
        ([True], "INT32", "must be integers"),
        (["1"], "INT64", "must be integers"),
        ([2**64], "UINT64", "non-unsigned-integer as unsigned-integer"),  # beyond 64 bits: a float
        ([-(2**63) - 1], "INT64", "must be integers"),
        ([-1], "UINT8", "outside the range of UINT8"),
        ([1], "BOOL", "Unable to parse 'data': attempt to access JSON non-boolean as boolean"),
        ([1], "BYTES", "Unable to parse JSON bytes array: attempt to access JSON non-string as string"),
        (["x"], "FP32", "Unable to parse 'data': attempt to access JSON non-number as double"),
        (["x"], "FP32", "not FP32: found strings"),
        ([1.5, True], "FP32", "Unable to parse 'data': attempt to access JSON non-number as double"),
        ([1, False], "FP64", "not FP64: found booleans"),  # (numpy would read them as 1 and 0)
        ([[1, 2], [3]], "FP32", "has 3 elements but its shape [1] needs 1"),
        ({"a": 1}, "FP32", "as a JSON list"),
    ],
)
def test_json_data_of_the_wrong_type(data: object, datatype: str, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=re.escape(message)):
        _decode({"inputs": [{"name": "a", "shape": [1], "datatype": datatype, "data": data}]})


@pytest.mark.parametrize("value", [1, 0, "true", 1.5])
def test_an_outputs_binary_data_that_is_not_a_boolean_is_refused_in_triton_words(value: object) -> None:
    output = {"name": "o", "parameters": {"binary_data": value}}
    data = {"name": "a", "shape": [1], "datatype": "FP32", "data": [1.0]}
    with pytest.raises(InvalidArgumentError, match=r"^Unable to parse 'binary_data': attempt to access JSON"):
        _decode({"inputs": [data], "outputs": [output]})


def test_large_uint64_values_keep_their_precision() -> None:
    request, _ = _decode(
        {"inputs": [{"name": "a", "shape": [2], "datatype": "UINT64", "data": [2**64 - 1, 1]}]}
    )
    assert request.inputs["a"].tolist() == [2**64 - 1, 1]


def test_bytes_codec_round_trip_and_errors() -> None:
    values = np.array([b"a", b"", bytes(range(256))], dtype=np.object_)
    encoded = encode_bytes_tensor(values)
    assert decode_bytes_tensor(encoded, 3, "t").tolist() == values.tolist()
    assert decode_bytes_tensor(encoded, None, "t").tolist() == values.tolist()
    with pytest.raises(InvalidArgumentError, match="ends inside element 2"):
        decode_bytes_tensor(encoded[:-1], 3, "t")
    # In Triton's words (ValidateBytesInputs), where Triton has them.
    incomplete = (
        "incomplete string length indicator for inference input 't' for model 'm', expecting 4 bytes "
        "but only 2 bytes available. Please make sure the string length indicator is in one buffer."
    )
    with pytest.raises(InvalidArgumentError) as info:
        decode_bytes_tensor(encoded[:2], 1, "t", "m")
    assert info.value.message == incomplete
    with pytest.raises(InvalidArgumentError) as info:
        decode_bytes_tensor(encoded + b"\0\0", 3, "t", "m")
    assert info.value.message == incomplete
    with pytest.raises(InvalidArgumentError) as info:
        decode_bytes_tensor(encoded, 2, "t", "m")
    assert info.value.message == (
        "unexpected number of string elements 3 for inference input 't' for model 'm', expecting 2"
    )
    with pytest.raises(InvalidArgumentError) as info:
        decode_bytes_tensor(encoded, 4, "t", "m")
    assert info.value.message == "expected 4 string elements for inference input 't' for model 'm', got 3"
    with pytest.raises(InvalidArgumentError) as info:  # (Triton counts the element cut short)
        decode_bytes_tensor(encoded[:-1], 4, "t", "m")
    assert info.value.message == "expected 4 string elements for inference input 't' for model 'm', got 3"


def test_raw_request_deduces_the_shape() -> None:
    spec = TensorSpec("in", DataType.FP32, (-1, 2))
    request, encoding = decode_raw_infer_request(np.zeros(6, np.float32).tobytes(), spec, True, "m", "")
    assert request.inputs["in"].shape == (1, 3, 2)
    assert encoding.binary_by_default
    text = TensorSpec("text", DataType.BYTES, (1,))
    request, _ = decode_raw_infer_request(b"\xffraw", text, False, "m", "")
    assert request.inputs["text"].tolist() == [b"\xffraw"]
    with pytest.raises(InvalidArgumentError, match="more than one variable-sized dimension"):
        decode_raw_infer_request(b"", TensorSpec("x", DataType.FP32, (-1, -1)), False, "m", "")
    with pytest.raises(InvalidArgumentError, match="must have input shape"):
        decode_raw_infer_request(b"", TensorSpec("x", DataType.BYTES, (2,)), False, "m", "")
    # A dimension of 0 deduces 0 for the -1; any data then fails the size check.
    empty = TensorSpec("x", DataType.FP32, (0, -1))
    assert decode_raw_infer_request(b"", empty, True, "m", "")[0].inputs["x"].shape == (1, 0, 0)
    with pytest.raises(InvalidArgumentError, match="Expected 0, got 4"):
        decode_raw_infer_request(bytes(4), empty, True, "m", "")


def test_encode_json_and_binary_outputs() -> None:
    response = InferenceResponse(
        model_name="m",
        model_version="2",
        id="r",
        outputs={
            "f": np.array([[1.5, 2.5]], np.float32),
            "s": np.array([b"x", b"yz"], dtype=np.object_),
            "h": np.array([1, 2], np.float16),
            "b": np.array([0.5], dtype=ml_dtypes.bfloat16),
        },
    )
    body, length = encode_infer_response(response, OutputPlan(binary={"s": True, "b": True}))
    assert length is not None
    header = json.loads(body[:length])
    assert header["id"] == "r" and header["model_version"] == "2"
    f, s, h, b = header["outputs"]
    assert f == {"name": "f", "datatype": "FP32", "shape": [1, 2], "data": [1.5, 2.5]}
    assert h["data"] == [1.0, 2.0] and h["datatype"] == "FP16"
    assert s["parameters"]["binary_data_size"] == 4 + 1 + 4 + 2
    assert b["datatype"] == "BF16" and b["parameters"]["binary_data_size"] == 2
    tail = body[length:]
    assert decode_bytes_tensor(tail[:11], 2, "s").tolist() == [b"x", b"yz"]
    assert np.frombuffer(tail[11:], dtype=ml_dtypes.bfloat16).tolist() == [0.5]


def test_encode_all_json_has_no_header_length() -> None:
    response = InferenceResponse("m", "1", {"o": np.array([True, False])})
    body, length = encode_infer_response(response, OutputPlan())
    assert length is None
    assert json.loads(body)["outputs"][0]["data"] == [True, False]


def _parsed_across_processes(body: bytes, header_length: int | None):
    """Decodes `body` as a worker process does: the JSON part parsed, pickled, completed."""
    header, binary = split_infer_body(body, header_length)
    document = pickle.loads(pickle.dumps(parse_infer_document(header, len(binary), "m"), protocol=5))
    return complete_infer_request(document, binary, "m", "")


def _outcome(decode) -> tuple[str, object]:
    try:
        request, encoding = decode()
    except CoreserveError as exc:
        return type(exc).__name__, exc.message
    inputs = {name: (array.dtype.str, array.shape, array.tolist()) for name, array in request.inputs.items()}
    return "request", (request.id, inputs, request.parameters, request.requested_outputs, encoding)


_FP32 = {"name": "f", "shape": [2], "datatype": "FP32", "data": [1.5, 2.5]}
_BINARY = {"name": "b", "shape": [2], "datatype": "INT16", "parameters": {"binary_data_size": 4}}
PARSED_APART = {
    "JSON and binary inputs": (
        {"id": "r", "inputs": [_FP32, _BINARY], "outputs": [{"name": "o"}]},
        b"\1\0\2\0",
    ),
    "request parameters": ({"inputs": [_FP32], "parameters": {"binary_data_output": True, "p": 1}}, b""),
    # The binary input's error comes first, as when each input is decoded in turn.
    "an error of a binary input before one of JSON data": (
        {"inputs": [{**_BINARY, "parameters": {"binary_data_size": 3}}, {**_FP32, "data": ["x", "y"]}]},
        b"\1\0\2",
    ),
    "an error of JSON data after a binary input": (
        {"inputs": [_BINARY, {**_FP32, "data": [1.0]}]},
        b"\1\0\2\0",
    ),
    "a repeated input, named with the request id": ({"id": "r7", "inputs": [_FP32, _FP32]}, b""),
    "binary data no input claims": ({"inputs": [_FP32]}, b"\0\0"),
    "a bad priority after good inputs": ({"inputs": [_FP32], "parameters": {"priority": -1}}, b""),
}


@pytest.mark.parametrize(("document", "binary"), PARSED_APART.values(), ids=PARSED_APART.keys())
def test_a_json_part_parsed_apart_decodes_as_the_whole_body(document: dict, binary: bytes) -> None:
    head = json.dumps(document).encode()
    length = len(head) if binary else None
    whole = _outcome(lambda: decode_infer_request(head + binary, length, "m", ""))
    assert _outcome(lambda: _parsed_across_processes(head + binary, length)) == whole


def test_large_json_outputs_are_written_in_slices_as_one_document() -> None:
    rng = np.random.default_rng(3)
    outputs = {
        "fp32": rng.random((JSON_SLICE_ELEMENTS * 2 + 5, 1)).astype(np.float32),
        "strided": rng.integers(-99, 99, (700, 1000)).astype(np.int64)[:, ::2],
        "text": np.array([f"v{i}".encode() for i in range(JSON_SLICE_ELEMENTS + 3)], dtype=np.object_),
        "bf16": rng.random(JSON_SLICE_ELEMENTS + 1).astype(ml_dtypes.bfloat16),
        "small": np.arange(3, dtype=np.int32),
        "binary": rng.random(3 * GATHER_BYTES).astype(np.float32),
    }
    response = InferenceResponse(
        model_name="m", model_version="1", outputs=outputs, id="i", parameters={"k": 1}
    )
    body, json_length = encode_infer_response(response, OutputPlan(binary={"binary": True}))
    assert json_length is not None
    json_outputs = []
    for name, array in outputs.items():
        output = {
            "name": name,
            "datatype": DataType.from_numpy(array.dtype).value,
            "shape": list(array.shape),
        }
        if name == "binary":
            output["parameters"] = {"binary_data_size": array.nbytes}
        elif name == "text":
            output["data"] = [item.decode() for item in array]
        else:
            floats = name in ("fp32", "bf16")  # written as the doubles they widen to, as Triton writes them
            output["data"] = np.ascontiguousarray(array.astype(np.float64) if floats else array).ravel()
        json_outputs.append(output)
    whole = {
        "model_name": "m",
        "model_version": "1",
        "outputs": json_outputs,
        "id": "i",
        "parameters": {"k": 1},
    }
    assert bytes(body[:json_length]) == orjson.dumps(whole, option=orjson.OPT_SERIALIZE_NUMPY)
    assert bytes(body[json_length:]) == outputs["binary"].tobytes()


def test_a_response_whose_text_holds_the_slices_placeholder_is_still_right() -> None:
    data = np.arange(JSON_SLICE_ELEMENTS + 1, dtype=np.int32)
    request_id = "\x00coreserve: data written in slices\x00"
    response = InferenceResponse(model_name="m", model_version="1", outputs={"o": data}, id=request_id)
    body, _ = encode_infer_response(response, OutputPlan())
    document = orjson.loads(body)
    assert document["id"] == request_id
    assert document["outputs"][0]["data"] == data.tolist()


def test_json_floats_are_written_as_triton_writes_them_non_finite_ones_too() -> None:
    values = np.array([np.nan, np.inf, -np.inf, 0.1, 1e-45], np.float32)
    large = np.zeros(JSON_SLICE_ELEMENTS + 2, np.float32)
    large[JSON_SLICE_ELEMENTS] = -np.inf  # in the second slice
    response = InferenceResponse(model_name="m", model_version="1", outputs={"v": values, "large": large})
    body, json_length = encode_infer_response(response, OutputPlan())
    assert json_length is None
    text = bytes(body).decode()
    assert '"data":[NaN,Infinity,-Infinity,0.10000000149011612,1.401298464324817e-45]' in text
    decoded = json.loads(text)  # Python's json reads those tokens, as tritonclient does
    np.testing.assert_array_equal(np.array(decoded["outputs"][0]["data"], np.float32), values)
    np.testing.assert_array_equal(np.array(decoded["outputs"][1]["data"], np.float32), large)


def test_non_finite_numbers_in_json_data_are_read_as_triton_reads_them() -> None:
    head = b'{"inputs":[{"name":"a","shape":[4],"datatype":"FP32","data":[NaN,Infinity,-Infinity,1]}]}'
    request, _ = decode_infer_request(head, None, "m", "")
    np.testing.assert_array_equal(request.inputs["a"], np.array([np.nan, np.inf, -np.inf, 1], np.float32))
    for wrong, reason in (
        (head.replace(b"1]}", b"1,]}"), "malformed JSON in the request body"),
        (head.replace(b'"inputs"', b'"id":"\\ud800","inputs"'), "malformed JSON in the request body"),
        (head.replace(b'"FP32"', b'"INT32"'), "INT32"),  # not an integer
    ):
        with pytest.raises(InvalidArgumentError, match=reason):
            decode_infer_request(wrong, None, "m", "")
