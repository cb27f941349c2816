"""The gRPC frontend through tritonclient.grpc (and raw stubs for what tritonclient never sends)."""

from __future__ import annotations

import os
import queue
import shutil
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from coreserve.protos import health_pb2, health_pb2_grpc
from coreserve.testing import ServerFactory, ServerProcess
from support.datatypes import datatype_sample, identity_config
from support.model_builders import ONNX_TYPES, add_sub_model, identity_model, write_model
from support.paths import TESTS

ADD_SUB = """
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
# Sleeps IN / 10 seconds, then answers it; two instances, so a later request can finish first.
SLEEPY = """
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            time.sleep(float(value[0]) / 10)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)]))
        return responses
"""
SLEEPY_CONFIG = """
backend: "python"
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 2 } ]
"""
ECHO_PARAMETERS = """
backend: "echo"
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


@pytest.fixture(scope="module")
def grpc_server_flags() -> list[str]:
    """The gRPC server of this module's servers: grpc.aio here (the default is the native
    server, on which test_native.py runs these tests again)."""
    return ["--grpc-server=grpcio"]


@pytest.fixture
def coreserve_server(coreserve_server: ServerFactory, grpc_server_flags: list[str]) -> ServerFactory:
    """The servers the tests below start, on this module's gRPC server."""

    def start(repository: Any, *args: str, **options: Any) -> ServerProcess:
        return coreserve_server(repository, *args, *grpc_server_flags, **options)

    return start


def test_the_chosen_grpc_server_answers(server: ServerProcess, grpc_server_flags: list[str]) -> None:
    assert "Started GRPCInferenceService at 127.0.0.1" in server.log
    assert ("(native HTTP/2)" in server.log) == ("--grpc-server=native" in grpc_server_flags)


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, echo_backend_site: Path, grpc_server_flags: list[str]
) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("grpc")
    write_model(repository, "add_sub", add_sub_model("FP32", ["batch", 4]), ADD_SUB)
    for datatype in ONNX_TYPES:
        name = f"identity_{datatype.lower()}"
        write_model(
            repository,
            name,
            identity_model(datatype, ["batch", "n"]),
            identity_config(name, datatype, "onnxruntime"),
        )
    write_model(
        repository, "echo_bf16", b"", identity_config("echo_bf16", "BF16", "echo"), filename="model.echo"
    )
    write_model(repository, "echo_parameters", b"", ECHO_PARAMETERS, filename="model.echo")
    write_model(repository, "broken", b"not onnx", ADD_SUB)
    write_model(repository, "sleepy", SLEEPY.encode(), SLEEPY_CONFIG, filename="model.py")
    shutil.copytree(TESTS / "plugins" / "python" / "models" / "countdown", repository / "countdown")
    env = {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(echo_backend_site), os.environ.get("PYTHONPATH")]))
    }
    process = ServerProcess([repository], ["--exit-on-error=false", *grpc_server_flags], env=env).start()
    yield process
    process.close()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


def _add_sub_inputs(a: np.ndarray, b: np.ndarray) -> list[grpcclient.InferInput]:
    inputs = [
        grpcclient.InferInput("INPUT0", list(a.shape), "FP32"),
        grpcclient.InferInput("INPUT1", list(b.shape), "FP32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def test_health_and_metadata(client: grpcclient.InferenceServerClient, server: ServerProcess) -> None:
    assert client.is_server_live()
    assert not client.is_server_ready()  # strict readiness: 'broken' is not ready
    assert client.is_model_ready("add_sub") and not client.is_model_ready("broken")
    metadata = client.get_server_metadata(as_json=True)
    assert metadata["name"] == "coreserve" and "statistics" in metadata["extensions"]
    model = client.get_model_metadata("add_sub", as_json=True)
    assert model["versions"] == ["1"] and model["platform"] == "onnxruntime_onnx"
    assert model["inputs"][0] == {"name": "INPUT0", "datatype": "FP32", "shape": ["-1", "4"]}
    config = client.get_model_config("add_sub", as_json=True)["config"]
    http = httpclient.InferenceServerClient(server.http_url)
    try:
        http_config = http.get_model_config("add_sub")
    finally:
        http.close()
    assert config["name"] == http_config["name"] == "add_sub"
    assert config["max_batch_size"] == http_config["max_batch_size"] == 8
    assert [t["name"] for t in config["input"]] == [t["name"] for t in http_config["input"]]


def test_infer_with_id(client: grpcclient.InferenceServerClient) -> None:
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    result = client.infer(
        "add_sub",
        _add_sub_inputs(a, a),
        request_id="grpc-1",
        outputs=[grpcclient.InferRequestedOutput("OUTPUT1")],
    )
    assert result.get_response().id == "grpc-1"
    assert [o.name for o in result.get_response().outputs] == ["OUTPUT1"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros((2, 4), np.float32))


@pytest.mark.parametrize("datatype", [*ONNX_TYPES, "BF16"])
def test_every_datatype(client: grpcclient.InferenceServerClient, datatype: str) -> None:
    data = datatype_sample(datatype)
    model = "echo_bf16" if datatype == "BF16" else f"identity_{datatype.lower()}"
    tensor = grpcclient.InferInput("INPUT0", list(data.shape), datatype)
    tensor.set_data_from_numpy(data)
    result = client.infer(model, [tensor]).as_numpy("OUTPUT0")
    assert result.shape == data.shape
    if datatype == "BYTES":
        assert result.tolist() == data.tolist()
    else:
        assert result.dtype == data.dtype
        np.testing.assert_array_equal(result, data)


def test_parameters_round_trip(client: grpcclient.InferenceServerClient) -> None:
    tensor = grpcclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([7], np.int32))
    result = client.infer(
        "echo_parameters", [tensor], parameters={"text": "hi", "n": 5, "flag": True, "x": 1.5}
    )
    parameters = result.get_response().parameters
    assert parameters["text"].string_param == "hi"
    assert parameters["n"].int64_param == 5
    assert parameters["flag"].bool_param is True
    assert parameters["x"].double_param == 1.5


def _stub(server: ServerProcess) -> tuple[grpc.Channel, service_pb2_grpc.GRPCInferenceServiceStub]:
    channel = grpc.insecure_channel(server.grpc_url)
    return channel, service_pb2_grpc.GRPCInferenceServiceStub(channel)


def test_typed_contents_are_accepted(server: ServerProcess) -> None:
    request = service_pb2.ModelInferRequest(model_name="add_sub")
    for name in ("INPUT0", "INPUT1"):
        tensor = request.inputs.add(name=name, datatype="FP32", shape=[1, 4])
        tensor.contents.fp32_contents.extend([1.0, 2.0, 3.0, 4.0])
    bytes_request = service_pb2.ModelInferRequest(model_name="identity_bytes")
    bytes_request.inputs.add(name="INPUT0", datatype="BYTES", shape=[1, 2]).contents.bytes_contents.extend(
        [b"a", b"bc"]
    )
    int_request = service_pb2.ModelInferRequest(model_name="identity_int8")
    int_request.inputs.add(name="INPUT0", datatype="INT8", shape=[1, 1]).contents.int_contents.append(300)
    channel, stub = _stub(server)
    with channel:
        response = stub.ModelInfer(request)
        assert np.frombuffer(response.raw_output_contents[0], np.float32).tolist() == [2, 4, 6, 8]
        response = stub.ModelInfer(bytes_request)
        assert response.raw_output_contents[0] == b"\x01\x00\x00\x00a\x02\x00\x00\x00bc"
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(int_request)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "outside the range of INT8" in info.value.details()


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda r: r.raw_input_contents.pop(),
            "unable to find data for input tensor 'INPUT1' for model 'add_sub' in request.",
        ),
        (
            lambda r: r.raw_input_contents.__setitem__(0, b"\x00" * 12),
            "input byte size mismatch for input 'INPUT0'",
        ),
        (
            lambda r: r.inputs[0].contents.fp32_contents.append(1.0),
            "contents field must not be specified when using raw",
        ),
        (
            lambda r: setattr(r.inputs[0], "datatype", "FLOAT"),
            "invalid datatype for input INPUT0: unknown datatype 'FLOAT'",
        ),
        (lambda r: r.inputs[0].shape.extend([1]), "Expected [-1,4], got [1,4,1]"),
        (lambda r: setattr(r.inputs[1], "name", "INPUT0"), "input 'INPUT0' already exists in request"),
    ],
)
def test_malformed_requests_are_invalid_argument(server: ServerProcess, mutate, message: str) -> None:
    request = service_pb2.ModelInferRequest(model_name="add_sub")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="FP32", shape=[1, 4])
        request.raw_input_contents.append(np.ones(4, np.float32).tobytes())
    mutate(request)
    channel, stub = _stub(server)
    with channel, pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in info.value.details()


def test_errors_map_to_triton_status_codes(
    client: grpcclient.InferenceServerClient, server: ServerProcess
) -> None:
    a = np.ones((1, 4), np.float32)
    with pytest.raises(InferenceServerException) as info:
        client.infer("nope", _add_sub_inputs(a, a))
    assert (
        info.value.status() == "StatusCode.NOT_FOUND"
        and "Request for unknown model: 'nope' is not found" in info.value.message()
    )
    with pytest.raises(InferenceServerException) as info:
        client.infer("broken", _add_sub_inputs(a, a))
    assert info.value.status() == "StatusCode.NOT_FOUND" and "onnxruntime cannot load" in info.value.message()
    wrong = [
        grpcclient.InferInput("INPUT0", [1, 4], "INT32"),
        grpcclient.InferInput("INPUT1", [1, 4], "FP32"),
    ]
    wrong[0].set_data_from_numpy(np.ones((1, 4), np.int32))
    wrong[1].set_data_from_numpy(a)
    with pytest.raises(InferenceServerException) as info:
        client.infer("add_sub", wrong)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    # The same message as the HTTP frontend gives.
    http = httpclient.InferenceServerClient(server.http_url)
    try:
        http_wrong = [
            httpclient.InferInput("INPUT0", [1, 4], "INT32"),
            httpclient.InferInput("INPUT1", [1, 4], "FP32"),
        ]
        http_wrong[0].set_data_from_numpy(np.ones((1, 4), np.int32))
        http_wrong[1].set_data_from_numpy(a)
        with pytest.raises(InferenceServerException) as http_info:
            http.infer("add_sub", http_wrong)
    finally:
        http.close()
    assert http_info.value.message() == info.value.message()
    with pytest.raises(InferenceServerException) as info:
        client.load_model("add_sub")  # outside explicit mode: Triton's UNAVAILABLE
    assert info.value.status() == "StatusCode.UNAVAILABLE"
    # CUDA shared memory's UNIMPLEMENTED without a GPU path: test_shared_memory.py, beside the GPU path's.
    assert client.infer("add_sub", _add_sub_inputs(a, a)).as_numpy("OUTPUT0").tolist() == [[2.0] * 4]


def test_repository_index(client: grpcclient.InferenceServerClient) -> None:
    index = {m.name: m for m in client.get_model_repository_index().models}
    assert index["add_sub"].state == "READY" and index["add_sub"].version == "1"
    assert index["broken"].state == "UNAVAILABLE" and "onnxruntime cannot load" in index["broken"].reason
    ready = {m.name for m in client.get_model_repository_index().models if m.state == "READY"}
    assert "broken" not in ready


def test_stream_with_an_error_in_the_middle(client: grpcclient.InferenceServerClient) -> None:
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=partial(lambda q, result, error: q.put((result, error)), results))
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    bad = [grpcclient.InferInput("INPUT0", [1, 4], "FP32")]
    bad[0].set_data_from_numpy(a)
    try:
        for index in range(5):
            if index == 2:
                client.async_stream_infer("add_sub", bad, request_id="bad")
            else:
                client.async_stream_infer("add_sub", _add_sub_inputs(a * index, a), request_id=f"r{index}")
        received = [results.get(timeout=30) for _ in range(5)]
    finally:
        client.stop_stream()
    errors = [error for result, error in received if error is not None]
    assert len(errors) == 1 and "missing required input(s) ['INPUT1']" in errors[0].message()
    by_id = {result.get_response().id: result for result, error in received if error is None}
    assert sorted(by_id) == ["r0", "r1", "r3", "r4"]
    for index in (0, 1, 3, 4):
        np.testing.assert_array_equal(by_id[f"r{index}"].as_numpy("OUTPUT0"), a * index + a)


def _int32(value: int) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], np.int32))
    return [tensor]


def test_a_streams_answers_come_in_the_order_of_its_requests_but_a_decoupled_models(
    client: grpcclient.InferenceServerClient,
) -> None:
    """As Triton's stream: a request answered early waits for those before it (here a slow one
    on the other instance, and an error), while a decoupled model's responses go out as they
    come (Triton's QA L0_simple_ensemble reads a stream's answers in order)."""
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=partial(lambda q, result, error: q.put((result, error)), results))
    countdown = grpcclient.InferInput("N", [1], "INT32")
    countdown.set_data_from_numpy(np.array([2], np.int32))
    try:
        client.async_stream_infer("sleepy", _int32(8), request_id="slow")
        client.async_stream_infer("sleepy", _int32(0), request_id="quick")
        client.async_stream_infer("nowhere", _int32(0), request_id="unknown")
        client.async_stream_infer("countdown", [countdown], request_id="decoupled")
        client.async_stream_infer("sleepy", _int32(0), request_id="last")
        received = [results.get(timeout=30) for _ in range(6)]
    finally:
        client.stop_stream()
    order = [result.get_response().id if error is None else "error" for result, error in received]
    assert [name for name in order if name != "decoupled"] == ["slow", "quick", "error", "last"]
    assert order.index("decoupled") < order.index("slow")  # not held behind the slow one
    assert "Request for unknown model: 'nowhere'" in next(error.message() for _, error in received if error)


def test_stream_final_response_flag(client: grpcclient.InferenceServerClient) -> None:
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=partial(lambda q, result, error: q.put((result, error)), results))
    a = np.ones((1, 4), np.float32)
    try:  # every response carries the flag, as Triton's do, whether the client asked for empty finals or not
        for enable in (True, False):
            client.async_stream_infer(
                "add_sub", _add_sub_inputs(a, a), request_id=f"f{enable}", enable_empty_final_response=enable
            )
        received = [results.get(timeout=30) for _ in range(2)]
    finally:
        client.stop_stream()
    for result, error in received:
        assert error is None
        response = result.get_response()
        assert "triton_final_response" in response.parameters
        assert response.parameters["triton_final_response"].bool_param is True
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * a)


def test_health_service(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        # Not serving: 'broken' keeps the server from being ready (strict readiness).
        assert (
            stub.Check(health_pb2.HealthCheckRequest()).status == health_pb2.HealthCheckResponse.NOT_SERVING
        )
        response = stub.Check(health_pb2.HealthCheckRequest(service="inference.GRPCInferenceService"))
        assert response.status == health_pb2.HealthCheckResponse.NOT_SERVING
        # Any service name is answered, as Triton answers it: a probe that names one passes there.
        response = stub.Check(health_pb2.HealthCheckRequest(service="other"))
        assert response.status == health_pb2.HealthCheckResponse.NOT_SERVING
        for service in ("", "other"):
            first = next(iter(stub.Watch(health_pb2.HealthCheckRequest(service=service), timeout=10)))
            assert first.status == health_pb2.HealthCheckResponse.NOT_SERVING


def test_health_serving_and_large_messages(coreserve_server, tmp_path: Path) -> None:
    write_model(
        tmp_path,
        "identity",
        identity_model("FP32", ["n"]),
        'backend: "onnxruntime"\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]',
    )
    server = coreserve_server(tmp_path)
    with grpc.insecure_channel(server.grpc_url) as channel:
        status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest()).status
        assert status == health_pb2.HealthCheckResponse.SERVING
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        data = np.arange(20 * 1024 * 1024, dtype=np.float32)  # 80 MiB
        tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        np.testing.assert_array_equal(client.infer("identity", [tensor]).as_numpy("OUTPUT0"), data)
    finally:
        client.close()


def test_message_size_limit(coreserve_server, tmp_path: Path) -> None:
    write_model(
        tmp_path,
        "identity",
        identity_model("FP32", ["n"]),
        'backend: "onnxruntime"\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]',
    )
    server = coreserve_server(tmp_path, "--grpc-max-message-size=1048576")
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        tensor = grpcclient.InferInput("INPUT0", [512 * 1024], "FP32")  # 2 MiB
        tensor.set_data_from_numpy(np.zeros(512 * 1024, np.float32))
        with pytest.raises(InferenceServerException) as info:
            client.infer("identity", [tensor])
        assert info.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        small = grpcclient.InferInput("INPUT0", [4], "FP32")
        small.set_data_from_numpy(np.ones(4, np.float32))
        assert client.infer("identity", [small]).as_numpy("OUTPUT0").tolist() == [1, 1, 1, 1]
    finally:
        client.close()


def test_grpc_can_be_turned_off(coreserve_server, tmp_path: Path) -> None:
    write_model(tmp_path, "add_sub", add_sub_model("FP32", ["batch", 4]), ADD_SUB)
    server = coreserve_server(tmp_path, "--allow-grpc=false", "--allow-metrics=false")
    assert "GRPC" not in server.ports and "Metrics" not in server.ports
    assert "Started GRPC" not in server.log
