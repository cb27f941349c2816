"""Bad requests get a clear error with the right status, and the server keeps serving."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerProcess
from support.model_builders import add_sub_model, identity_model, write_model
from support.wire.http_raw import error_of, post_json, request

ADD_SUB = """
name: "add_sub"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
FIXED = """
backend: "onnxruntime"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2, 3 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2, 3 ] } ]
"""
TEXT_ANY = """
backend: "onnxruntime"
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
"""
TWO_WILD = """
backend: "onnxruntime"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1, -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1, -1 ] } ]
"""
INFER = "/v2/models/add_sub/infer"
MAX_BODY = 64 * 1024


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("errors")
    write_model(repository, "add_sub", add_sub_model("FP32", ["batch", 4]), ADD_SUB)
    write_model(repository, "fixed", identity_model("FP32", [2, 3]), FIXED)
    write_model(repository, "text_any", identity_model("BYTES", [-1]), TEXT_ANY)
    write_model(repository, "two_wild", identity_model("FP32", [-1, -1]), TWO_WILD)
    write_model(repository, "bad_syntax", add_sub_model(), "name: 'bad_syntax' max_batch_size: [oops")
    write_model(repository, "unknown_field", add_sub_model(), "colour: 'blue'")
    write_model(repository, "missing_file", None, ADD_SUB.replace('"add_sub"', '"missing_file"'))
    write_model(
        repository,
        "wrong_names",
        add_sub_model(),
        ADD_SUB.replace('"add_sub"', '"wrong_names"').replace('"INPUT1"', '"OTHER"'),
    )
    write_model(
        repository,
        "wrong_type",
        add_sub_model(),
        ADD_SUB.replace('"add_sub"', '"wrong_type"').replace("TYPE_FP32", "TYPE_INT32"),
    )
    write_model(repository, "no_versions", None, ADD_SUB.replace('"add_sub"', '"no_versions"'), versions=())
    write_model(repository, "needs_dali", b"", 'backend: "dali"', filename="model.dali")
    write_model(
        repository, "not_onnx", b"this is not an onnx file", ADD_SUB.replace('"add_sub"', '"not_onnx"')
    )
    write_model(repository, "misnamed", add_sub_model(), ADD_SUB)  # config names another model
    write_model(
        repository,
        "bad_batching",
        add_sub_model(),
        ADD_SUB.replace('"add_sub"', '"bad_batching"') + "dynamic_batching { preferred_batch_size: [ 16 ] }",
    )
    write_model(
        repository,
        "bad_dims",
        add_sub_model(),
        ADD_SUB.replace('"add_sub"', '"bad_dims"').replace(
            'dims: [ 4 ] }, { name: "INPUT1"', 'dims: [ 0 ] }, { name: "INPUT1"'
        ),
    )
    process = ServerProcess(
        [repository], ["--exit-on-error=false", f"--http-max-input-size={MAX_BODY}"]
    ).start()
    yield process
    process.close()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.http_url)
    yield client
    client.close()


def _valid_request() -> dict:
    return {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
            {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": [1, 1, 1, 1]},
        ]
    }


def _assert_still_serving(server: ServerProcess) -> None:
    status, body = post_json(server.http_url, INFER, _valid_request())
    assert status == 200, body
    assert body["outputs"][0]["data"] == [2, 3, 4, 5]


UNAVAILABLE_REASONS = {
    "bad_syntax": "config.pbtxt",
    "unknown_field": 'no field named "colour"',
    "missing_file": "model.onnx not found",
    "wrong_names": "configuration input 'OTHER' is not an input of the ONNX model",
    "wrong_type": "the configuration says INT32, the ONNX model has FP32",
    "no_versions": "has no version folder to serve",
    "needs_dali": "backend 'dali' is not served by any installed backend",
    "not_onnx": "onnxruntime cannot load",
    "misnamed": "config field 'name' is 'add_sub', but the model's folder is named 'misnamed'",
    "bad_batching": "preferred_batch_size' holds 16, outside 1..max_batch_size (8)",
    "bad_dims": "every entry of dims must be -1 (any size) or >= 1",
}


@pytest.mark.parametrize(("model", "reason"), list(UNAVAILABLE_REASONS.items()))
def test_broken_models_are_unavailable_with_reason(
    client: httpclient.InferenceServerClient, server: ServerProcess, model: str, reason: str
) -> None:
    assert not client.is_model_ready(model)
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata(model)
    assert info.value.status() == "404"  # Triton: no available versions is NOT_FOUND
    assert reason in info.value.message()
    status, error = error_of(
        server.http_url, f"/v2/models/{model}/infer", json.dumps(_valid_request()).encode()
    )
    assert status == 404 and reason in error
    assert reason in server.log  # the start-up table shows it too
    _assert_still_serving(server)


def test_strict_readiness_reports_not_ready(client: httpclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert not client.is_server_ready()
    assert client.is_model_ready("add_sub")


def _with(document: dict, **changes: object) -> dict:
    return {**document, **changes}


def _input(index: int, **changes: object) -> dict:
    document = _valid_request()
    document["inputs"][index].update(changes)
    return document


BAD_JSON_REQUESTS = {
    "malformed JSON": (b'{"inputs": [', "malformed JSON"),
    "not an object": (b"[1, 2]", "must be a JSON object"),
    "no inputs": (b"{}", "needs 'inputs'"),
    "inputs not a list": (json.dumps({"inputs": {"INPUT0": 1}}).encode(), "needs 'inputs'"),
    "input without name": (json.dumps({"inputs": [{"shape": [1]}]}).encode(), "needs a 'name'"),
    "unknown datatype": (
        json.dumps(_input(0, datatype="FLOAT")).encode(),
        "invalid datatype for input INPUT0",
    ),
    "shape not a list": (json.dumps(_input(0, shape="1x4")).encode(), "needs 'shape'"),
    "negative dimension": (json.dumps(_input(0, shape=[1, -4])).encode(), "needs 'shape'"),
    "no data": (
        json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32"}]}).encode(),
        "But no field is set (input 'INPUT0')",
    ),
    "strings for FP32": (
        json.dumps(_input(0, data=["1", "2", "3", "4"])).encode(),
        "attempt to access JSON non-number as double (input 'INPUT0' has data that is not FP32: found strings)",
    ),
    "null in data": (json.dumps(_input(0, data=[1, None, 3, 4])).encode(), "not FP32"),
    "too few elements": (
        json.dumps(_input(0, data=[1, 2, 3])).encode(),
        "has 3 elements but its shape [1, 4] needs 4",
    ),
    "ragged nested data": (
        json.dumps(_input(0, data=[[1, 2], [3]], shape=[2, 2])).encode(),
        "elements but its shape",
    ),
    "duplicate input": (
        json.dumps({"inputs": [_valid_request()["inputs"][0]] * 2}).encode(),
        "input 'INPUT0' already exists in request",
    ),
    "unknown input": (json.dumps(_input(1, name="INPUT9")).encode(), "unexpected inference input 'INPUT9'"),
    "missing input": (
        json.dumps({"inputs": _valid_request()["inputs"][:1]}).encode(),
        "expected 2 inputs but got 1 inputs for model 'add_sub'",
    ),
    "wrong datatype": (
        json.dumps(_input(0, datatype="INT32")).encode(),
        "inference input 'INPUT0' data-type is 'INT32', but model 'add_sub' expects 'FP32'",
    ),
    "wrong shape": (json.dumps(_input(0, shape=[1, 2, 2])).encode(), "Expected [-1,4], got [1,2,2]"),
    "batch too large": (
        json.dumps(_input(1, shape=[9, 4], data=[0.0] * 36)).encode(),  # the input checked first
        "inference request batch-size must be <= 8 for 'add_sub'",
    ),
    "zero batch": (json.dumps(_input(1, shape=[0, 4], data=[])).encode(), "must be between 1 and 8"),
    "batch mismatch": (
        json.dumps(_input(1, shape=[2, 4], data=[0.0] * 8)).encode(),
        "batch size does not match other inputs for 'add_sub'",
    ),
    "unknown output": (
        json.dumps(_with(_valid_request(), outputs=[{"name": "OUTPUT7"}])).encode(),
        "unexpected inference output 'OUTPUT7'",
    ),
    "classification count below 1": (
        json.dumps(
            _with(_valid_request(), outputs=[{"name": "OUTPUT0", "parameters": {"classification": -1}}])
        ).encode(),
        "invalid value for 'classification' parameter",
    ),
    "nested parameter": (
        json.dumps(_with(_valid_request(), parameters={"x": {"y": 1}})).encode(),
        "must be a boolean, number or string",
    ),
    "id not a string": (json.dumps(_with(_valid_request(), id=5)).encode(), "'id' must be a string"),
    "integer out of range": (
        b'{"inputs":[{"name":"INPUT0","shape":[1],"datatype":"INT8","data":[300]}]}',
        "outside the range of INT8",
    ),
}


@pytest.mark.parametrize("case", list(BAD_JSON_REQUESTS))
def test_bad_json_requests(server: ServerProcess, case: str) -> None:
    body, message = BAD_JSON_REQUESTS[case]
    status, error = error_of(server.http_url, INFER, body)
    assert status == 400, error
    assert message in error
    _assert_still_serving(server)


def _binary_request(sizes: tuple[int, int], payload: bytes, header: dict | None = None) -> tuple[bytes, dict]:
    document = {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": [1, 4],
                "datatype": "FP32",
                "parameters": {"binary_data_size": sizes[0]},
            },
            {
                "name": "INPUT1",
                "shape": [1, 4],
                "datatype": "FP32",
                "parameters": {"binary_data_size": sizes[1]},
            },
        ]
    }
    head = json.dumps(header or document).encode()
    return head + payload, {"Inference-Header-Content-Length": str(len(head))}


def test_binary_request_is_decoded(server: ServerProcess) -> None:
    payload = np.arange(4, dtype=np.float32).tobytes() + np.ones(4, dtype=np.float32).tobytes()
    body, headers = _binary_request((16, 16), payload)
    status, _, reply = request(server.http_url, "POST", INFER, body, headers)
    assert status == 200
    assert json.loads(reply)["outputs"][0]["data"] == [1.0, 2.0, 3.0, 4.0]


BAD_BINARY_REQUESTS = {
    "size does not fit the shape": (
        (12, 16),
        28,
        "input byte size mismatch for input 'INPUT0' for model 'add_sub'. Expected 16, got 12",
    ),
    "size beyond the body": (
        (16, 64),
        32,
        "unexpected size for input 'INPUT1', expecting 48 additional bytes for model 'add_sub'",
    ),
    "bytes left over": ((16, 16), 40, "8 bytes of binary data that no input claims"),
}


@pytest.mark.parametrize("case", list(BAD_BINARY_REQUESTS))
def test_bad_binary_requests(server: ServerProcess, case: str) -> None:
    sizes, length, message = BAD_BINARY_REQUESTS[case]
    body, headers = _binary_request(sizes, bytes(length))
    status, error = error_of(server.http_url, INFER, body, headers)
    assert status == 400, error
    assert message in error
    _assert_still_serving(server)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("abc", "must be an integer"),
        ("-3", "must be >= 0"),
        ("100000", "but the body holds"),
    ],
)
def test_bad_header_length(server: ServerProcess, value: str, message: str) -> None:
    body = json.dumps(_valid_request()).encode()
    status, error = error_of(server.http_url, INFER, body, {"Inference-Header-Content-Length": value})
    assert status == 400 and message in error


def test_raw_binary_request(server: ServerProcess) -> None:
    data = np.arange(6, dtype=np.float32)
    status, headers, reply = request(
        server.http_url,
        "POST",
        "/v2/models/fixed/infer",
        data.tobytes(),
        {"Inference-Header-Content-Length": "0"},
    )
    assert status == 200
    json_length = int(headers["Inference-Header-Content-Length"])
    header = json.loads(reply[:json_length])
    assert header["outputs"][0]["shape"] == [2, 3]
    np.testing.assert_array_equal(np.frombuffer(reply[json_length:], dtype=np.float32), data)


@pytest.mark.parametrize(
    ("model", "body", "message"),
    [
        (
            "fixed",
            bytes(20),
            "input byte size mismatch for input 'INPUT0' for model 'fixed'. Expected 24, got 20",
        ),
        (
            "add_sub",
            bytes(16),
            "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in 'add_sub' "
            "model configuration",
        ),
        ("text_any", b"427", "For BYTE datatype raw input 'INPUT0', the model must have input shape [1]"),
        (
            "two_wild",
            bytes(16),
            "The shape of the raw input 'INPUT0' can not be deduced because there are more than one "
            "variable-sized dimension",
        ),
    ],
    ids=["size", "two-inputs", "bytes-not-one-element", "two-variable-dims"],
)
def test_a_raw_request_the_model_does_not_fit_is_refused_in_tritons_words(
    server: ServerProcess, model: str, body: bytes, message: str
) -> None:
    status, error = error_of(
        server.http_url, f"/v2/models/{model}/infer", body, {"Inference-Header-Content-Length": "0"}
    )
    assert status == 400 and error.startswith(f"[request id: <id_unknown>] {message}"), error
    _assert_still_serving(server)


def test_body_over_the_limit_is_refused(server: ServerProcess) -> None:
    status, error = error_of(server.http_url, INFER, b"{" + b" " * (MAX_BODY + 10) + b"}")
    assert status == 413 and "too large" in error
    _assert_still_serving(server)


def test_unknown_model_version_and_endpoint(server: ServerProcess) -> None:
    body = json.dumps(_valid_request()).encode()
    assert error_of(server.http_url, "/v2/models/nope/infer", body) == (
        404,
        "Request for unknown model: 'nope' is not found",
    )
    status, error = error_of(server.http_url, "/v2/models/add_sub/versions/3/infer", body)
    assert status == 404 and "Request for unknown model: 'add_sub' version 3 is not found" in error
    status, error = error_of(server.http_url, "/v2/models/add_sub/versions/x1/infer", body)
    assert status == 404 and error.startswith("Not Found"), error  # Triton's routes take digits only
    status, _, reply = request(server.http_url, "GET", "/v2/nothing/here")
    assert status == 404 and "unknown endpoint" in json.loads(reply)["error"]
    _assert_still_serving(server)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_request_and_response(client: httpclient.InferenceServerClient, algorithm: str) -> None:
    inputs = [
        httpclient.InferInput("INPUT0", [2, 4], "FP32"),
        httpclient.InferInput("INPUT1", [2, 4], "FP32"),
    ]
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a, binary_data=False)
    result = client.infer(
        "add_sub", inputs, request_compression_algorithm=algorithm, response_compression_algorithm=algorithm
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2)


def test_corrupt_gzip_body_is_refused(server: ServerProcess) -> None:
    status, _, _ = request(server.http_url, "POST", INFER, b"not gzip at all", {"Content-Encoding": "gzip"})
    assert status == 400
    _assert_still_serving(server)


def test_requested_outputs_only(client: httpclient.InferenceServerClient) -> None:
    inputs = [
        httpclient.InferInput("INPUT0", [1, 4], "FP32"),
        httpclient.InferInput("INPUT1", [1, 4], "FP32"),
    ]
    inputs[0].set_data_from_numpy(np.ones((1, 4), np.float32))
    inputs[1].set_data_from_numpy(np.ones((1, 4), np.float32))
    result = client.infer("add_sub", inputs, outputs=[httpclient.InferRequestedOutput("OUTPUT1")])
    assert [o["name"] for o in result.get_response()["outputs"]] == ["OUTPUT1"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros((1, 4), np.float32))


@pytest.mark.parametrize(
    ("model", "body", "headers", "message"),
    [
        (
            "fixed",
            b"",
            {},
            "input byte size mismatch for input 'INPUT0' for model 'fixed'. Expected 24, got 0",
        ),
        ("fixed", gzip.compress(b""), {"Content-Encoding": "gzip"}, "Expected 24, got 0"),
        ("add_sub", b"", {}, "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs"),
    ],
    ids=["empty", "empty-after-gzip", "two-inputs"],
)
def test_an_empty_body_with_no_header_length_is_a_raw_request_as_in_triton(
    server: ServerProcess, model: str, body: bytes, headers: dict[str, str], message: str
) -> None:
    # Triton 2.51 (run here) takes the header's length from the body's when the header is absent.
    status, error = error_of(server.http_url, f"/v2/models/{model}/infer", body, headers)
    assert status == 400 and error.startswith("[request id: <id_unknown>] ") and message in error, error
    _assert_still_serving(server)
