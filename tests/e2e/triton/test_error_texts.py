"""The errors a client meets every day, in Triton's words, over HTTP and gRPC.

Client programs (and Triton's own client examples) match on error text, so each message starts
with, or contains, what Triton 2.51 says for the same mistake; coreserve's detail may follow.
Each Triton text below is taken from Triton's source (core: model_lifecycle.cc,
model_repository_manager.cc, infer_request.cc; server: http_server.cc, grpc/infer_handler.cc)
and was checked against the real tritonserver 2.51 with the same requests to a python-backend
model of the same signature.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerProcess
from support.model_builders import add_sub_model, identity_model, write_model
from support.wire.http_raw import error_of, request

ADD_SUB = """
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
STRINGS = """
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ 2 ] } ]
"""
DECOUPLED_CONFIG = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
DECOUPLED_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""
BATCH_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be "
    "prepended to each input shape."
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("repository")
    write_model(repository, "add_sub", add_sub_model("FP32", ["batch", 4]), ADD_SUB)
    # Version 2's file is not a model: version 2 is UNAVAILABLE and, as in Triton, so is version 1.
    folder = write_model(
        repository, "two_versions", add_sub_model("FP32", ["batch", 4]), ADD_SUB + "version_policy { all {} }"
    )
    (folder / "2").mkdir()
    (folder / "2" / "model.onnx").write_bytes(b"not onnx")
    write_model(repository, "broken", b"not onnx", ADD_SUB)
    write_model(repository, "strings", identity_model("BYTES", ["batch", 2]), STRINGS)
    folder = write_model(repository, "decoupled", None, DECOUPLED_CONFIG)
    (folder / "1" / "model.py").write_text(DECOUPLED_MODEL)
    args = [
        "--model-control-mode=explicit",
        "--load-model=add_sub",
        "--load-model=two_versions",
        "--load-model=broken",
        "--load-model=strings",
        "--load-model=decoupled",
        "--exit-on-error=false",
    ]
    process = ServerProcess([repository], args).start()
    yield process
    process.close()


# Each test leaves no traceback in the server's log (tests/e2e/conftest.py).
pytestmark = pytest.mark.usefixtures("no_traceback")


# --- HTTP ---------------------------------------------------------------------------------


def _tensor(
    name: str, shape: list[int], datatype: str = "FP32", data: list[Any] | None = None
) -> dict[str, Any]:
    return {
        "name": name,
        "datatype": datatype,
        "shape": shape,
        "data": data if data is not None else [1.0] * 4,
    }


def _infer_body(*tensors: dict[str, Any], **extra: Any) -> bytes:
    return json.dumps({"inputs": list(tensors), **extra}).encode()


INPUT0 = _tensor("INPUT0", [1, 4])
INPUT1 = _tensor("INPUT1", [1, 4])
GOOD = _infer_body(INPUT0, INPUT1)

# case: (method, path, body, Triton's text)
HTTP_CASES: dict[str, tuple[str, str, bytes | None, str]] = {
    "unknown model": (
        "POST",
        "/v2/models/nosuch/infer",
        GOOD,
        "Request for unknown model: 'nosuch' is not found",
    ),
    "unknown model metadata": (
        "GET",
        "/v2/models/nosuch",
        None,
        "Request for unknown model: 'nosuch' is not found",
    ),
    "unknown model config": (
        "GET",
        "/v2/models/nosuch/config",
        None,
        "Request for unknown model: 'nosuch' is not found",
    ),
    "unknown version": (
        "POST",
        "/v2/models/add_sub/versions/7/infer",
        GOOD,
        "Request for unknown model: 'add_sub' version 7 is not found",
    ),
    # Triton's routes take a version of digits only: any other is no endpoint at all.
    "malformed version": ("POST", "/v2/models/add_sub/versions/abc/infer", GOOD, "Not Found"),
    "negative version": ("POST", "/v2/models/add_sub/versions/-1/infer", GOOD, "Not Found"),
    "version not ready": (
        "POST",
        "/v2/models/two_versions/versions/2/infer",
        GOOD,
        "Request for unknown model: 'two_versions' version 2 is not at ready state",
    ),
    "no ready version": (
        "POST",
        "/v2/models/broken/infer",
        GOOD,
        "Request for unknown model: 'broken' has no available versions",
    ),
    "unknown version statistics": (
        "GET",
        "/v2/models/add_sub/versions/7/stats",
        None,
        "requested model version is not available for model 'add_sub'",
    ),
    "unknown model statistics": (
        "GET",
        "/v2/models/nosuch/stats",
        None,
        "requested model 'nosuch' is not available",
    ),
    "load of a model not in the repository": (
        "POST",
        "/v2/repository/models/nosuch/load",
        None,
        "failed to load 'nosuch', failed to poll from model repository",
    ),
    "load that fails": (
        "POST",
        "/v2/repository/models/broken/load",
        None,
        "load failed for model 'broken': version 1 is at UNAVAILABLE state: ",
    ),
    "unknown input": (
        "POST",
        "/v2/models/add_sub/infer",
        _infer_body(INPUT0, _tensor("INPUT9", [1, 4])),
        "unexpected inference input 'INPUT9' for model 'add_sub'",
    ),
    "missing input": (
        "POST",
        "/v2/models/add_sub/infer",
        _infer_body(INPUT0),
        "expected 2 inputs but got 1 inputs for model 'add_sub'. Got input(s) ['INPUT0'], but missing "
        "required input(s) ['INPUT1']. Please provide all required input(s).",
    ),
    "duplicate input": (
        "POST",
        "/v2/models/add_sub/infer",
        _infer_body(INPUT0, INPUT0, INPUT1),
        "input 'INPUT0' already exists in request",
    ),
    "wrong datatype": (
        "POST",
        "/v2/models/add_sub/infer",
        _infer_body(_tensor("INPUT0", [1, 4], "INT32", [1, 2, 3, 4]), INPUT1),
        "inference input 'INPUT0' data-type is 'INT32', but model 'add_sub' expects 'FP32'",
    ),
    "unknown datatype": (
        "POST",
        "/v2/models/add_sub/infer",
        _infer_body(_tensor("INPUT0", [1, 4], "FLOAT"), INPUT1),
        "invalid datatype for input INPUT0",
    ),
    "wrong shape": (
        "POST",
        "/v2/models/add_sub/infer",
        _infer_body(_tensor("INPUT0", [1, 2, 2]), INPUT1),
        "unexpected shape for input 'INPUT0' for model 'add_sub'. Expected [-1,4], got [1,2,2]. "
        + BATCH_NOTE,
    ),
    "batch too large": (
        "POST",
        "/v2/models/add_sub/infer",
        _infer_body(_tensor("INPUT0", [9, 4], data=[1.0] * 36), _tensor("INPUT1", [9, 4], data=[1.0] * 36)),
        "inference request batch-size must be <= 8 for 'add_sub'",
    ),
    "batch sizes differ": (
        "POST",
        "/v2/models/add_sub/infer",
        _infer_body(INPUT0, _tensor("INPUT1", [2, 4], data=[1.0] * 8)),
        "input 'INPUT0' batch size does not match other inputs for 'add_sub'",
    ),
    "unknown output": (
        "POST",
        "/v2/models/add_sub/infer",
        _infer_body(INPUT0, INPUT1, outputs=[{"name": "OUTPUT7"}]),
        "unexpected inference output 'OUTPUT7' for model 'add_sub'",
    ),
    "decoupled model on the infer endpoint": (
        "POST",
        "/v2/models/decoupled/infer",
        _infer_body(_tensor("IN", [4])),
        "HTTP end point doesn't support models with decoupled transaction policy",
    ),
    "data and a shared memory region": (
        "POST",
        "/v2/models/add_sub/infer",
        _infer_body(
            {**INPUT0, "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 16}}, INPUT1
        ),
        "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
        "'shared_memory_region' in 'parameters'. But set 'data' 'shared_memory_region'",
    ),
    "an output in a shared memory region as binary data": (
        "POST",
        "/v2/models/add_sub/infer",
        _infer_body(
            INPUT0,
            INPUT1,
            outputs=[{"name": "OUTPUT0", "parameters": {"shared_memory_region": "r", "binary_data": True}}],
        ),
        "Output can't set both 'shared_memory_region' and 'binary_data'",
    ),
    "an output in a shared memory region as classes": (
        "POST",
        "/v2/models/add_sub/infer",
        _infer_body(
            INPUT0,
            INPUT1,
            outputs=[{"name": "OUTPUT0", "parameters": {"shared_memory_region": "r", "classification": 2}}],
        ),
        "Output can't set both 'shared_memory_region' and 'classification'",
    ),
    "binary data beyond the body": (
        "POST",
        "/v2/models/add_sub/infer",
        _infer_body({**INPUT0, "data": None, "parameters": {"binary_data_size": 16}}, INPUT1),
        "unexpected size for input 'INPUT0', expecting 16 additional bytes for model 'add_sub'",
    ),
}


# The status the real Triton 2.51 answers where it is not 400 (checked with the same requests).
TRITON_STATUS = {
    "malformed version": 404,
    "negative version": 404,
    "unknown model": 404,
    "unknown model metadata": 404,
    "unknown model config": 404,
    "unknown version": 404,
    "version not ready": 503,
    "no ready version": 404,
    "load of a model not in the repository": 500,
    "decoupled model on the infer endpoint": 501,
}


def _without_data(tensor: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in tensor.items() if key != "data"}


def _without_null_data(body: bytes) -> bytes:
    document = json.loads(body)
    for tensor in document.get("inputs", []):
        if tensor.get("data", 0) is None:
            del tensor["data"]
    return json.dumps(document).encode()


@pytest.mark.parametrize("case", list(HTTP_CASES))
def test_http_says_what_triton_says(server: ServerProcess, case: str) -> None:
    method, path, body, triton_text = HTTP_CASES[case]
    status, _, reply = request(server.http_url, method, path, _without_null_data(body) if body else b"")
    message = json.loads(reply)["error"]
    assert status == TRITON_STATUS.get(case, 400), (status, message)
    assert triton_text in message, message


# --- gRPC ---------------------------------------------------------------------------------


def _infer_request(
    model: str = "add_sub",
    version: str = "",
    inputs: tuple[tuple[str, list[int], str], ...] = (("INPUT0", [1, 4], "FP32"), ("INPUT1", [1, 4], "FP32")),
    raw: list[bytes] | None = None,
    outputs: tuple[str, ...] = (),
) -> service_pb2.ModelInferRequest:
    message = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    for name, shape, datatype in inputs:
        message.inputs.add(name=name, shape=shape, datatype=datatype)
    for data in raw if raw is not None else [np.ones(4, np.float32).tobytes()] * len(inputs):
        message.raw_input_contents.append(data)
    for name in outputs:
        message.outputs.add(name=name)
    return message


def _with_contents(
    on: tuple[int, ...],
    raw_entries: int,
    model: str = "add_sub",
    names: tuple[str, str] = ("INPUT0", "INPUT1"),
    entry: bytes = np.ones(4, np.float32).tobytes(),
) -> service_pb2.ModelInferRequest:
    """add_sub's request with typed contents on the inputs `on` and `raw_entries` raw entries."""
    inputs = tuple((name, [1, 4], "FP32") for name in names)
    message = _infer_request(model, inputs=inputs, raw=[entry] * raw_entries)
    for index in on:
        message.inputs[index].contents.fp32_contents.extend([1, 2, 3, 4])
    return message


def _typed_contents(
    fp32: tuple[list[float], list[float]], int32: list[int] | None = None
) -> service_pb2.ModelInferRequest:
    """add_sub's request with its inputs' data in typed contents: `fp32` for each, and `int32` in
    the first one's int_contents where given."""
    message = _infer_request(raw=[])
    for tensor, values in zip(message.inputs, fp32, strict=True):
        tensor.contents.fp32_contents.extend(values)
    if int32 is not None:
        message.inputs[0].contents.int_contents.extend(int32)
    return message


def _changed(
    message: service_pb2.ModelInferRequest,
    index: int,
    shape: list[int] | None = None,
    datatype: str = "",
    region: str = "",
) -> service_pb2.ModelInferRequest:
    """`message` with one input's shape or datatype changed, or that input put in a region."""
    tensor = message.inputs[index]
    if shape is not None:
        tensor.ClearField("shape")
        tensor.shape.extend(shape)
    if datatype:
        tensor.datatype = datatype
    if region:
        tensor.parameters["shared_memory_region"].string_param = region
        tensor.parameters["shared_memory_byte_size"].int64_param = 16
    return message


CONTENTS_BESIDE_RAW = (
    "contents field must not be specified when using raw_input_contents for '{}' for model 'add_sub'"
)
NO_DATA = "unable to find data for input tensor '{}' for model 'add_sub' in request."


Call = Callable[[service_pb2_grpc.GRPCInferenceServiceStub], Any]
# case: (call, status code, Triton's text)
GRPC_CASES: dict[str, tuple[Call, grpc.StatusCode, str]] = {
    "typed contents in another type's field": (
        lambda stub: stub.ModelInfer(_typed_contents(([], [1, 2, 3, 4]), int32=[1, 2, 3, 4])),
        grpc.StatusCode.INVALID_ARGUMENT,
        "unexpected explicit tensor data for input tensor 'INPUT0' for model 'add_sub' of type 'INT32', "
        "expected datatype 'FP32'",
    ),
    "typed contents of the wrong count": (
        lambda stub: stub.ModelInfer(_typed_contents(([1, 2, 3, 4], [1, 2, 3]))),
        grpc.StatusCode.INVALID_ARGUMENT,
        "[request id: <id_unknown>] input byte size mismatch for input 'INPUT1' for model 'add_sub'. "
        "Expected 16, got 12",
    ),
    "unknown model": (
        lambda stub: stub.ModelInfer(_infer_request("nosuch")),
        grpc.StatusCode.NOT_FOUND,
        "Request for unknown model: 'nosuch' is not found",
    ),
    "unknown model metadata": (
        lambda stub: stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="nosuch")),
        grpc.StatusCode.NOT_FOUND,
        "Request for unknown model: 'nosuch' is not found",
    ),
    "unknown version": (
        lambda stub: stub.ModelInfer(_infer_request(version="7")),
        grpc.StatusCode.NOT_FOUND,
        "Request for unknown model: 'add_sub' version 7 is not found",
    ),
    "malformed version": (
        lambda stub: stub.ModelInfer(_infer_request(version="abc")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "failed to get model version from specified version string 'abc'",
    ),
    "malformed version of metadata": (
        lambda stub: stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="add_sub", version="abc")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "failed to get model version from specified version string 'abc'",
    ),
    "negative version": (
        lambda stub: stub.ModelInfer(_infer_request(version="-1")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "invalid model version specified '-1'",
    ),
    "version not ready": (
        lambda stub: stub.ModelInfer(_infer_request("two_versions", "2")),
        grpc.StatusCode.UNAVAILABLE,
        "Request for unknown model: 'two_versions' version 2 is not at ready state",
    ),
    "no ready version": (
        lambda stub: stub.ModelInfer(_infer_request("broken")),
        grpc.StatusCode.NOT_FOUND,
        "Request for unknown model: 'broken' has no available versions",
    ),
    "statistics of an unknown model": (
        lambda stub: stub.ModelStatistics(service_pb2.ModelStatisticsRequest(name="nosuch")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "requested model 'nosuch' is not available",
    ),
    "statistics of an unknown version": (
        lambda stub: stub.ModelStatistics(service_pb2.ModelStatisticsRequest(name="add_sub", version="7")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "requested model version is not available for model 'add_sub'",
    ),
    "load of a model not in the repository": (
        lambda stub: stub.RepositoryModelLoad(service_pb2.RepositoryModelLoadRequest(model_name="nosuch")),
        grpc.StatusCode.INTERNAL,
        "failed to load 'nosuch', failed to poll from model repository",
    ),
    "load that fails": (
        lambda stub: stub.RepositoryModelLoad(service_pb2.RepositoryModelLoadRequest(model_name="broken")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "load failed for model 'broken': version 1 is at UNAVAILABLE state: ",
    ),
    "malformed version of readiness": (
        lambda stub: stub.ModelReady(service_pb2.ModelReadyRequest(name="add_sub", version="abc")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "failed to get model version from specified version string 'abc'",
    ),
    "raw data of the wrong size": (
        lambda stub: stub.ModelInfer(_infer_request(raw=[np.ones(3, np.float32).tobytes()] * 2)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "input byte size mismatch for input 'INPUT0' for model 'add_sub'. Expected 16, got 12",
    ),
    "unknown input": (
        lambda stub: stub.ModelInfer(
            _infer_request(inputs=(("INPUT0", [1, 4], "FP32"), ("INPUT9", [1, 4], "FP32")))
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "unexpected inference input 'INPUT9' for model 'add_sub'",
    ),
    "missing input": (
        lambda stub: stub.ModelInfer(_infer_request(inputs=(("INPUT0", [1, 4], "FP32"),))),
        grpc.StatusCode.INVALID_ARGUMENT,
        "expected 2 inputs but got 1 inputs for model 'add_sub'. Got input(s) ['INPUT0'], but missing "
        "required input(s) ['INPUT1']. Please provide all required input(s).",
    ),
    "wrong datatype": (
        lambda stub: stub.ModelInfer(
            _infer_request(inputs=(("INPUT0", [1, 4], "INT32"), ("INPUT1", [1, 4], "FP32")))
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "inference input 'INPUT0' data-type is 'INT32', but model 'add_sub' expects 'FP32'",
    ),
    "wrong shape": (
        lambda stub: stub.ModelInfer(
            _infer_request(inputs=(("INPUT0", [1, 2, 2], "FP32"), ("INPUT1", [1, 4], "FP32")))
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "unexpected shape for input 'INPUT0' for model 'add_sub'. Expected [-1,4], got [1,2,2]. "
        + BATCH_NOTE,
    ),
    "batch too large": (
        lambda stub: stub.ModelInfer(
            _infer_request(
                inputs=(("INPUT0", [9, 4], "FP32"), ("INPUT1", [9, 4], "FP32")),
                raw=[np.ones(36, np.float32).tobytes()] * 2,
            )
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "inference request batch-size must be <= 8 for 'add_sub'",
    ),
    "decoupled model on ModelInfer": (
        lambda stub: stub.ModelInfer(_infer_request("decoupled", inputs=(("IN", [4], "FP32"),))),
        grpc.StatusCode.UNIMPLEMENTED,
        "ModelInfer RPC doesn't support models with decoupled transaction policy",
    ),
    "unknown output": (
        lambda stub: stub.ModelInfer(_infer_request(outputs=("OUTPUT7",))),
        grpc.StatusCode.INVALID_ARGUMENT,
        "unexpected inference output 'OUTPUT7' for model 'add_sub'",
    ),
}


@pytest.mark.parametrize("case", list(GRPC_CASES))
def test_grpc_says_what_triton_says(server: ServerProcess, case: str) -> None:
    call, code, triton_text = GRPC_CASES[case]
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            call(stub)
    assert info.value.code() == code, info.value.details()
    assert triton_text in info.value.details()


# Typed contents beside raw_input_contents, with the count of raw entries off as well: which
# mistake Triton 2.51 names. Its gRPC frontend finds the model first, then adds every input (a
# name given twice fails there), then finds each input's data in turn (its region, its
# contents, which must not come with raw entries, or the next raw entry) and names the first
# input that has none; raw entries beyond the inputs are ignored. Datatypes and shapes come
# after that. Each answer below is the real Triton's, in full, to the same request.
# case: (request, status code, Triton's text)
ORDER_CASES: dict[str, tuple[service_pb2.ModelInferRequest, grpc.StatusCode, str]] = {
    "contents on the first input, raw for both": (
        _with_contents((0,), 2),
        grpc.StatusCode.INVALID_ARGUMENT,
        CONTENTS_BESIDE_RAW.format("INPUT0"),
    ),
    "contents on the first input, too few raw entries": (
        _with_contents((0,), 1),
        grpc.StatusCode.INVALID_ARGUMENT,
        CONTENTS_BESIDE_RAW.format("INPUT0"),
    ),
    "contents on the first input, too many raw entries": (
        _with_contents((0,), 3),
        grpc.StatusCode.INVALID_ARGUMENT,
        CONTENTS_BESIDE_RAW.format("INPUT0"),
    ),
    "contents on a later input, too few raw entries": (
        _with_contents((1,), 1),
        grpc.StatusCode.INVALID_ARGUMENT,
        CONTENTS_BESIDE_RAW.format("INPUT1"),
    ),
    "contents on a later input, too many raw entries": (
        _with_contents((1,), 3),
        grpc.StatusCode.INVALID_ARGUMENT,
        CONTENTS_BESIDE_RAW.format("INPUT1"),
    ),
    "contents on both inputs, one raw entry": (
        _with_contents((0, 1), 1),
        grpc.StatusCode.INVALID_ARGUMENT,
        CONTENTS_BESIDE_RAW.format("INPUT0"),
    ),
    "contents on a later input, raw of the wrong size": (
        _with_contents((1,), 2, entry=np.ones(3, np.float32).tobytes()),
        grpc.StatusCode.INVALID_ARGUMENT,
        CONTENTS_BESIDE_RAW.format("INPUT1"),
    ),
    "contents on a later input, the first's shape wrong": (
        _changed(_with_contents((1,), 1), 0, shape=[1, 2]),
        grpc.StatusCode.INVALID_ARGUMENT,
        CONTENTS_BESIDE_RAW.format("INPUT1"),
    ),
    "contents on a later input, the first's datatype unknown": (
        _changed(_with_contents((1,), 1), 0, datatype="FLOAT"),
        grpc.StatusCode.INVALID_ARGUMENT,
        CONTENTS_BESIDE_RAW.format("INPUT1"),
    ),
    "contents on the first input, a later one in an unregistered region": (
        _changed(_with_contents((0,), 1), 1, region="nosuchregion"),
        grpc.StatusCode.INVALID_ARGUMENT,
        CONTENTS_BESIDE_RAW.format("INPUT0"),
    ),
    "a later input in an unregistered region": (
        _changed(_with_contents((), 2), 1, region="nosuchregion"),
        grpc.StatusCode.NOT_FOUND,
        "Unable to find shared memory region: 'nosuchregion'",
    ),
    "an input named twice, contents on the first": (
        _with_contents((0,), 1, names=("INPUT0", "INPUT0")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "[request id: <id_unknown>] input 'INPUT0' already exists in request",
    ),
    "unknown model, contents beside raw": (
        _with_contents((0,), 1, model="nosuch"),
        grpc.StatusCode.NOT_FOUND,
        "Request for unknown model: 'nosuch' is not found",
    ),
    "contents on the first input only, no raw entries": (
        _with_contents((0,), 0),
        grpc.StatusCode.INVALID_ARGUMENT,
        NO_DATA.format("INPUT1"),
    ),
    "neither contents nor raw entries": (
        _with_contents((), 0),
        grpc.StatusCode.INVALID_ARGUMENT,
        NO_DATA.format("INPUT0"),
    ),
    "too few raw entries": (
        _with_contents((), 1),
        grpc.StatusCode.INVALID_ARGUMENT,
        NO_DATA.format("INPUT1"),
    ),
    "too many raw entries, one input missing": (
        _infer_request(inputs=(("INPUT0", [1, 4], "FP32"),), raw=[np.ones(4, np.float32).tobytes()] * 2),
        grpc.StatusCode.INVALID_ARGUMENT,
        "[request id: <id_unknown>] expected 2 inputs but got 1 inputs for model 'add_sub'. Got input(s) "
        "['INPUT0'], but missing required input(s) ['INPUT1']. Please provide all required input(s).",
    ),
    # (Triton's QA L0_backend_python bls test_bls_wrong_inputs: the count comes before the datatype)
    "one input missing, the other of the wrong datatype": (
        _infer_request(inputs=(("INPUT0", [1, 4], "FP64"),), raw=[np.ones(4, np.float64).tobytes()]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "[request id: <id_unknown>] expected 2 inputs but got 1 inputs for model 'add_sub'. Got input(s) "
        "['INPUT0'], but missing required input(s) ['INPUT1']. Please provide all required input(s).",
    ),
}


@pytest.mark.parametrize("case", list(ORDER_CASES))
def test_grpc_names_the_mistake_triton_names_first(server: ServerProcess, case: str) -> None:
    message, code, triton_text = ORDER_CASES[case]
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(message)
        assert (info.value.code(), info.value.details()) == (code, triton_text)
        # On a stream, the same words come back in the request's own response.
        message.id = "s1"
        (reply,) = stub.ModelStreamInfer(iter([message]), timeout=30)
    assert reply.infer_response.id == "s1"
    assert reply.error_message == triton_text.replace("<id_unknown>", "s1")


def test_raw_entries_beyond_the_inputs_are_ignored_as_in_triton(server: ServerProcess) -> None:
    extra = _with_contents((), 3)
    with grpc.insecure_channel(server.grpc_url) as channel:
        reply = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(extra)
    assert np.frombuffer(reply.raw_output_contents[0], np.float32).tolist() == [2.0] * 4


# --- The request's id in errors -------------------------------------------------------------
# Triton puts `[request id: ID] ` (`<id_unknown>` when the request has none) before the errors it
# finds once the request exists (inputs' count, datatypes, shapes, sizes, batch size), and not
# before those of the frontend's parsing or of the model lookup. Checked against the real 2.51.

BINARY_HEADER = json.dumps(
    {"id": "r1", "inputs": [{**_without_data(INPUT0), "parameters": {"binary_data_size": 12}}, INPUT1]}
).encode()
# case: (body with "id": "r1", the message as Triton's starts)
ID_CASES: dict[str, tuple[bytes, str]] = {
    "missing input": (_infer_body(INPUT0, id="r1"), "[request id: r1] expected 2 inputs but got 1 inputs"),
    "wrong datatype": (
        _infer_body(_tensor("INPUT0", [1, 4], "INT32", [1, 2, 3, 4]), INPUT1, id="r1"),
        "[request id: r1] inference input 'INPUT0' data-type is 'INT32'",
    ),
    "wrong shape": (
        _infer_body(_tensor("INPUT0", [1, 2, 2]), INPUT1, id="r1"),
        "[request id: r1] unexpected shape for input 'INPUT0' for model 'add_sub'",
    ),
    "batch too large": (
        _infer_body(
            _tensor("INPUT0", [9, 4], data=[1.0] * 36), _tensor("INPUT1", [9, 4], data=[1.0] * 36), id="r1"
        ),
        "[request id: r1] inference request batch-size must be <= 8 for 'add_sub'",
    ),
    "duplicate input": (
        _infer_body(INPUT0, INPUT0, INPUT1, id="r1"),
        "[request id: r1] input 'INPUT0' already exists in request",
    ),
    "no id": (_infer_body(INPUT0), "[request id: <id_unknown>] expected 2 inputs but got 1 inputs"),
    "empty id": (_infer_body(INPUT0, id=""), "[request id: <id_unknown>] expected 2 inputs"),
    "unknown input": (
        _infer_body(INPUT0, _tensor("INPUT9", [1, 4]), id="r1"),
        "unexpected inference input 'INPUT9' for model 'add_sub'",
    ),
    "unknown output": (
        _infer_body(INPUT0, INPUT1, outputs=[{"name": "OUTPUT7"}], id="r1"),
        "unexpected inference output 'OUTPUT7' for model 'add_sub'",
    ),
}


@pytest.mark.parametrize("case", list(ID_CASES))
def test_http_errors_name_the_request_as_triton_does(server: ServerProcess, case: str) -> None:
    body, triton_start = ID_CASES[case]
    status, message = error_of(server.http_url, "/v2/models/add_sub/infer", body)
    assert status == 400 and message.startswith(triton_start), message


def test_binary_data_and_generate_errors_name_the_request(server: ServerProcess) -> None:
    body = BINARY_HEADER + np.ones(3, np.float32).tobytes()
    headers = {"Inference-Header-Content-Length": str(len(BINARY_HEADER))}
    status, message = error_of(server.http_url, "/v2/models/add_sub/infer", body, headers)
    assert status == 400 and message.startswith(
        "[request id: r1] input byte size mismatch for input 'INPUT0' for model 'add_sub'. Expected 16, got 12"
    ), message
    generate = json.dumps({"id": "g7", "INPUT0": [1.0] * 4}).encode()
    status, message = error_of(server.http_url, "/v2/models/add_sub/generate", generate)
    assert status == 400 and message.startswith("[request id: g7] expected 2 inputs but got 1 inputs"), (
        message
    )


@pytest.mark.parametrize("client", [httpclient, grpcclient])
def test_bytes_of_the_wrong_count_name_the_request_as_triton_does(server: ServerProcess, client: Any) -> None:
    url = server.http_url if client is httpclient else server.grpc_url
    one = client.InferInput("INPUT0", [1, 1], "BYTES")
    one.set_data_from_numpy(np.array([[b"one"]], dtype=np.object_))
    one.set_shape([1, 2])  # the data holds one element of the two the shape says
    with client.InferenceServerClient(url) as triton, pytest.raises(InferenceServerException) as info:
        triton.infer("strings", [one])
    assert info.value.message().endswith(
        "[request id: <id_unknown>] expected 2 string elements for inference input 'INPUT0' for model "
        "'strings', got 1"
    )


def test_grpc_errors_name_the_request_as_triton_does(server: ServerProcess) -> None:
    missing = _infer_request(inputs=(("INPUT0", [1, 4], "FP32"),))
    short = _infer_request(raw=[np.ones(3, np.float32).tobytes()] * 2)
    unknown = _infer_request(inputs=(("INPUT0", [1, 4], "FP32"), ("INPUT9", [1, 4], "FP32")))
    cases = [
        (missing, "q1", "[request id: q1] expected 2 inputs but got 1 inputs"),
        (missing, "", "[request id: <id_unknown>] expected 2 inputs but got 1 inputs"),
        (short, "q2", "[request id: q2] input byte size mismatch for input 'INPUT0' for model 'add_sub'"),
        (unknown, "q3", "unexpected inference input 'INPUT9' for model 'add_sub'"),
    ]
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for message, request_id, triton_start in cases:
            message.id = request_id
            with pytest.raises(grpc.RpcError) as info:
                stub.ModelInfer(message)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert info.value.details().startswith(triton_start), info.value.details()
        # On a stream, the error comes back in the response that carries the request's id.
        missing.id = "s2"
        replies = list(stub.ModelStreamInfer(iter([_infer_request("nosuch"), missing]), timeout=30))
    assert [reply.infer_response.id for reply in replies] == ["", "s2"]
    assert replies[0].error_message.startswith("Request for unknown model: 'nosuch' is not found")
    assert replies[1].error_message.startswith("[request id: s2] expected 2 inputs but got 1 inputs")


def test_unloading_a_model_that_is_not_loaded_succeeds_as_in_triton(server: ServerProcess) -> None:
    status, _, reply = request(server.http_url, "POST", "/v2/repository/models/nosuch/unload", b"")
    assert (status, reply) == (200, b"")
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        stub.RepositoryModelUnload(service_pb2.RepositoryModelUnloadRequest(model_name="nosuch"))


# --- Loads with parameters ------------------------------------------------------------------
# Triton 2.51 answers a `config` or a file it cannot take with 500 / INTERNAL "failed to load
# '<model>', failed to poll from model repository" (the reason goes only to its log). The mistake
# is the client's: coreserve answers 400 / INVALID_ARGUMENT in Triton's words, then the reason.
# Two of these Triton does not answer at all: a file name over 255 bytes, or a path too long for
# the file system, aborts the real tritonserver 2.51 (an uncaught filesystem_error).

ADD_PY = b"""
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a + b)]))
        return responses
"""
ADD_CONFIG = json.dumps(
    {
        "backend": "python",
        "max_batch_size": 0,
        "input": [
            {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]},
            {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [-1]},
        ],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
    }
)


def _poll_failed(model: str) -> str:
    return f"failed to load '{model}', failed to poll from model repository: "


def _uploaded(**files: bytes) -> dict[str, str | bytes]:
    return {"config": ADD_CONFIG, "file:1/model.py": ADD_PY, **{f"file:{k}": v for k, v in files.items()}}


# case: (model, parameters, Triton's words, coreserve's reason after them)
LOAD_CASES: dict[str, tuple[str, dict[str, Any], str, str]] = {
    "config that is not JSON": (
        "add_sub",
        {"config": "{not json"},
        _poll_failed("add_sub"),
        "Invalid config override: not valid JSON: Expecting property name",
    ),
    "config that is not JSON, of a model not in the repository": (
        "nosuch",
        {"config": '{"backend": "python"'},
        _poll_failed("nosuch"),
        "Invalid config override: not valid JSON: Expecting ',' delimiter",
    ),
    "config that is not a JSON object": (
        "add_sub",
        {"config": "[1, 2]"},
        _poll_failed("add_sub"),
        "Invalid config override: Root element must be a message",
    ),
    "config with an unknown field": (
        "add_sub",
        {"config": '{"colour": 1}'},
        _poll_failed("add_sub"),
        'Invalid config override: Message type "inference.ModelConfig" has no field named "colour"',
    ),
    "files without a config": (
        "uploaded",
        {"file:1/model.py": ADD_PY},
        _poll_failed("uploaded"),
        "Load parameter 'config' must be specified for model file override",
    ),
    "a file path that leaves the model's folder": (
        "uploaded",
        {**_uploaded(), "file:../escape.py": b"x"},
        _poll_failed("uploaded"),
        "file path '../escape.py' is not a relative path inside the model's folder",
    ),
    "files whose paths clash": (
        "uploaded",
        _uploaded(**{"1/model.py/inner": b"x"}),
        _poll_failed("uploaded"),
        "file path '1/model.py/inner' cannot be written",
    ),
    "a file name over 255 bytes (Triton aborts)": (
        "uploaded",
        _uploaded(**{f"1/{'f' * 256}": b"x"}),
        _poll_failed("uploaded"),
        "has a name of 256 bytes; file systems hold at most 255",
    ),
    "a file path too long (Triton aborts)": (
        "uploaded",
        _uploaded(**{"/".join(["d" * 200] * 25): b"x"}),
        _poll_failed("uploaded"),
        "is longer than 2048 bytes",
    ),
    # Refused by Triton's gRPC frontend in these words (its HTTP frontend answers 500 with other
    # words: "attempt to access JSON non-string as string", "unexpected error on creating Triton
    # parameter").
    "config that is not a string": (
        "add_sub",
        {"config": 5},
        "invalid value type for load parameter 'config', expected string_param.",
        "",
    ),
    "an unknown parameter": ("add_sub", {"colour": "blue"}, "unrecognized load parameter 'colour'.", ""),
}


@pytest.mark.parametrize("case", list(LOAD_CASES))
def test_load_parameters_are_refused_in_triton_words(server: ServerProcess, case: str) -> None:
    model, parameters, triton_text, reason = LOAD_CASES[case]
    encoded = {
        key: base64.b64encode(value).decode() if isinstance(value, bytes) else value
        for key, value in parameters.items()
    }
    body = json.dumps({"parameters": encoded}).encode()
    status, message = error_of(server.http_url, f"/v2/repository/models/{model}/load", body)
    assert status == 400, message
    assert message.startswith(triton_text) and reason in message, message
    load = service_pb2.RepositoryModelLoadRequest(model_name=model)
    for key, value in parameters.items():
        if isinstance(value, bytes):
            load.parameters[key].bytes_param = value
        elif isinstance(value, int):
            load.parameters[key].int64_param = value
        else:
            load.parameters[key].string_param = value
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.RepositoryModelLoad(load)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith(triton_text) and reason in info.value.details()


def test_a_file_sent_as_text_over_grpc_is_refused_in_triton_words(server: ServerProcess) -> None:
    load = service_pb2.RepositoryModelLoadRequest(model_name="uploaded")
    load.parameters["config"].string_param = ADD_CONFIG
    load.parameters["file:1/model.py"].string_param = ADD_PY.decode()
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.RepositoryModelLoad(load)
    assert (info.value.code(), info.value.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "invalid value type for load parameter 'file:1/model.py', expected bytes_param.",
    )


@pytest.mark.parametrize(("length", "transport"), [(255, "http"), (256, "http"), (300, "grpc")])
def test_a_long_model_name_loads_from_files_as_in_triton(
    server: ServerProcess, length: int, transport: str
) -> None:
    """Triton 2.51 loads these (the files go to a folder it names itself); so does coreserve,
    and serves tensors too large to travel inline to the Python stub."""
    name = transport[0] * length
    files = {"file:1/model.py": ADD_PY}
    client: Any = (
        httpclient.InferenceServerClient(server.http_url, network_timeout=120)
        if transport == "http"
        else grpcclient.InferenceServerClient(server.grpc_url)
    )
    module = httpclient if transport == "http" else grpcclient
    try:
        client.load_model(name, config=ADD_CONFIG, files=files)
        data = np.arange(40_000, dtype=np.float32)  # 160 kB: through shared memory, not inline
        tensors = [module.InferInput(n, list(data.shape), "FP32") for n in ("INPUT0", "INPUT1")]
        for tensor in tensors:
            tensor.set_data_from_numpy(data)
        assert np.array_equal(client.infer(name, tensors).as_numpy("OUTPUT0"), data * 2)
        client.unload_model(name)
    finally:
        client.close()


def test_the_model_keeps_serving_after_every_mistake(server: ServerProcess) -> None:
    status, _, reply = request(server.http_url, "POST", "/v2/models/add_sub/infer", GOOD)
    assert status == 200 and json.loads(reply)["outputs"][0]["data"] == [2.0] * 4
