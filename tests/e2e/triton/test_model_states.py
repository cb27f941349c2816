"""Versions in paths and fields, models that failed to load, and `priority`, as Triton 2.51 answers.

Each expectation was taken from the real tritonserver 2.51 with the same requests to python-backend
models of the same layout (a good model, a model whose only version fails, a model with
`version_policy { all {} }` whose version 2 fails):
- HTTP routes take a version of digits only: `/versions/abc/...` and `/versions/-1/...` are 404
  "Not Found"; over gRPC a version is read as std::stoll reads it ("1x" is 1, "0" is a version
  that is not found, "abc" and numbers beyond int64 are INVALID_ARGUMENT).
- A model with a version that failed to load serves no version: its other versions are unloaded
  ("unloaded" in the repository index); its config is NOT_FOUND (UNAVAILABLE for one version),
  its statistics INVALID_ARG, and `/v2/models/stats` leaves it out. A reload whose new version
  fails keeps the versions being served.
- HTTP model readiness is 400 `{"error":"Model version not ready"}` (an unknown model too); gRPC
  answers ready=false.
- `priority` and `timeout` over HTTP must be JSON unsigned integers, else "Unable to parse 'priority': ..."
  (Triton answers it with a 500, coreserve with a 400 as for every client mistake); over gRPC an int64_param >= 0 or a uint64_param, else INVALID_ARGUMENT. A
  priority beyond the model's levels gets its default level.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from coreserve.testing import ServerFactory, ServerProcess
from support.model_builders import add_sub_model, write_model
from support.waiting import wait_until
from support.wire.http_raw import request

ADD_SUB = """
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
ALL_VERSIONS = ADD_SUB + "version_policy { all {} }"
TENSORS = [
    {"name": name, "datatype": "FP32", "shape": [1, 4], "data": [1.0] * 4} for name in ("INPUT0", "INPUT1")
]
GOOD = json.dumps({"inputs": TENSORS}).encode()
VERSIONED_ROUTES = [("GET", ""), ("GET", "/ready"), ("GET", "/config"), ("GET", "/stats"), ("POST", "/infer")]


def _write_two_versions(repository: Path, name: str, second_works: bool) -> None:
    """A model of versions 1 and 2 served together; version 2's file is not a model unless `second_works`."""
    folder = write_model(repository, name, add_sub_model("FP32", ["batch", 4]), ALL_VERSIONS, versions=(1, 2))
    if not second_works:
        (folder / "2" / "model.onnx").write_bytes(b"not onnx")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("repository")
    write_model(repository, "add_sub", add_sub_model("FP32", ["batch", 4]), ADD_SUB)
    write_model(repository, "broken", b"not onnx", ADD_SUB)
    _write_two_versions(repository, "two_versions", second_works=False)
    process = ServerProcess([repository], ["--exit-on-error=false"]).start()
    yield process
    process.close()


# Each test leaves no traceback in the server's log (tests/e2e/conftest.py).
pytestmark = pytest.mark.usefixtures("no_traceback")


def _get(server: ServerProcess, method: str, path: str, body: bytes = b"") -> tuple[int, str]:
    """(status, the `error` of the reply, "" when there is none)."""
    status, _, reply = request(server.http_url, method, path, body)
    return status, json.loads(reply).get("error", "") if reply.startswith(b"{") else ""


def _stub(server: ServerProcess) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(server.grpc_url) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


@pytest.fixture
def stub(server: ServerProcess) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    yield from _stub(server)


def _infer_message(
    model: str = "add_sub", version: str = "", **parameters: Any
) -> service_pb2.ModelInferRequest:
    message = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    for name in ("INPUT0", "INPUT1"):
        message.inputs.add(name=name, shape=[1, 4], datatype="FP32")
        message.raw_input_contents.append(np.ones(4, np.float32).tobytes())
    for key, (field, value) in parameters.items():
        setattr(message.parameters[key], field, value)
    return message


def _grpc_error(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code(), info.value.details()


def _serves(server: ServerProcess) -> None:
    status, _, reply = request(server.http_url, "POST", "/v2/models/add_sub/infer", GOOD)
    assert status == 200 and json.loads(reply)["outputs"][0]["data"] == [2.0] * 4


# --- 1. Versions ----------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["abc", "-1", "1x", ""])
@pytest.mark.parametrize(("method", "route"), VERSIONED_ROUTES)
def test_http_a_version_that_is_not_digits_is_no_route(
    server: ServerProcess, version: str, method: str, route: str
) -> None:
    status, message = _get(server, method, f"/v2/models/add_sub/versions/{version}{route}", GOOD)
    assert status == 404 and message.startswith("Not Found"), message


def test_http_version_zero_and_numbers_beyond_int64(server: ServerProcess) -> None:
    assert _get(server, "GET", "/v2/models/add_sub/versions/0") == (
        404,
        "Request for unknown model: 'add_sub' version 0 is not found",
    )
    assert _get(server, "GET", "/v2/models/add_sub/versions/0/ready") == (400, "Model version not ready")
    status, message = _get(server, "GET", "/v2/models/add_sub/versions/0/stats")
    assert status == 400 and message.startswith(
        "requested model version is not available for model 'add_sub'"
    )
    huge = "99999999999999999999"
    for method, route in VERSIONED_ROUTES:
        status, message = _get(server, method, f"/v2/models/add_sub/versions/{huge}{route}", GOOD)
        assert (status, message) == (
            400,
            f"failed to get model version from specified version string '{huge}' (details: stol), version "
            "should be an integral value > 0",
        )
    assert _get(server, "GET", "/v2/models/add_sub/versions/01/ready") == (200, "")
    _serves(server)


GRPC_VERSION_CALLS = {
    "infer": lambda stub, v: stub.ModelInfer(_infer_message(version=v)),
    "metadata": lambda stub, v: stub.ModelMetadata(
        service_pb2.ModelMetadataRequest(name="add_sub", version=v)
    ),
    "config": lambda stub, v: stub.ModelConfig(service_pb2.ModelConfigRequest(name="add_sub", version=v)),
}


@pytest.mark.parametrize("call", list(GRPC_VERSION_CALLS))
def test_grpc_reads_a_version_as_triton_does(
    stub: service_pb2_grpc.GRPCInferenceServiceStub, call: str
) -> None:
    send = GRPC_VERSION_CALLS[call]
    assert _grpc_error(lambda: send(stub, "abc")) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "failed to get model version from specified version string 'abc' (details: stol), version should be "
        "an integral value > 0",
    )
    assert _grpc_error(lambda: send(stub, "-1")) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "invalid model version specified '-1' , version should be an integral value > 0",
    )
    assert _grpc_error(lambda: send(stub, "99999999999999999999"))[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert _grpc_error(lambda: send(stub, "0")) == (
        grpc.StatusCode.NOT_FOUND,
        "Request for unknown model: 'add_sub' version 0 is not found",
    )
    for leading_digits in ("01", "1x", " 1"):  # std::stoll reads the leading integer
        send(stub, leading_digits)


def test_grpc_statistics_and_readiness_of_versions(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    code, message = _grpc_error(
        lambda: stub.ModelStatistics(service_pb2.ModelStatisticsRequest(name="add_sub", version="0"))
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert message.startswith("requested model version is not available for model 'add_sub'")
    stats = stub.ModelStatistics(service_pb2.ModelStatisticsRequest(name="add_sub", version="1x"))
    assert [s.version for s in stats.model_stats] == ["1"]
    assert not stub.ModelReady(service_pb2.ModelReadyRequest(name="add_sub", version="0")).ready
    assert stub.ModelReady(service_pb2.ModelReadyRequest(name="add_sub", version="01")).ready
    assert _grpc_error(lambda: stub.ModelReady(service_pb2.ModelReadyRequest(name="add_sub", version="abc")))[
        0
    ] == (grpc.StatusCode.INVALID_ARGUMENT)


# --- 2 and 3. Models that failed to load -----------------------------------------------------


@pytest.mark.parametrize("model", ["broken", "two_versions"])
def test_http_a_model_that_failed_to_load_serves_nothing(server: ServerProcess, model: str) -> None:
    none_available = f"Request for unknown model: '{model}' has no available versions"
    for method, route in [("GET", ""), ("GET", "/config"), ("POST", "/infer")]:
        status, message = _get(server, method, f"/v2/models/{model}{route}", GOOD)
        assert status == 404 and message.startswith(none_available), (route, message)
    for method, route in [("GET", ""), ("GET", "/config"), ("POST", "/infer")]:
        status, message = _get(server, method, f"/v2/models/{model}/versions/1{route}", GOOD)
        assert status == 503, (route, message)
        assert message.startswith(f"Request for unknown model: '{model}' version 1 is not at ready state")
    for path in (f"/v2/models/{model}/stats", f"/v2/models/{model}/versions/1/stats"):
        status, message = _get(server, "GET", path)
        assert status == 400 and message.startswith(f"requested model '{model}' is not available"), message
    for path in (
        f"/v2/models/{model}/ready",
        f"/v2/models/{model}/versions/1/ready",
        "/v2/models/nosuch/ready",
    ):
        assert _get(server, "GET", path) == (400, "Model version not ready")
    _serves(server)


def test_statistics_and_index_leave_out_what_did_not_load(server: ServerProcess) -> None:
    status, _, reply = request(server.http_url, "GET", "/v2/models/stats")
    assert status == 200
    assert [(s["name"], s["version"]) for s in json.loads(reply)["model_stats"]] == [("add_sub", "1")]
    status, _, reply = request(server.http_url, "POST", "/v2/repository/index", b"{}")
    index = {(e["name"], e.get("version")): (e["state"], e.get("reason", "")) for e in json.loads(reply)}
    assert index[("two_versions", "1")] == ("UNAVAILABLE", "unloaded")
    state, reason = index[("two_versions", "2")]
    assert state == "UNAVAILABLE" and "onnxruntime cannot load" in reason
    assert index[("add_sub", "1")] == ("READY", "")
    assert "unloaded model 'two_versions' version(s) 1: another version failed to load" in server.log


@pytest.mark.parametrize("model", ["broken", "two_versions"])
def test_grpc_a_model_that_failed_to_load_serves_nothing(
    stub: service_pb2_grpc.GRPCInferenceServiceStub, model: str
) -> None:
    code, message = _grpc_error(lambda: stub.ModelConfig(service_pb2.ModelConfigRequest(name=model)))
    assert code == grpc.StatusCode.NOT_FOUND
    assert message.startswith(f"Request for unknown model: '{model}' has no available versions")
    code, _ = _grpc_error(lambda: stub.ModelConfig(service_pb2.ModelConfigRequest(name=model, version="1")))
    assert code == grpc.StatusCode.UNAVAILABLE
    code, message = _grpc_error(lambda: stub.ModelStatistics(service_pb2.ModelStatisticsRequest(name=model)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert message.startswith(f"requested model '{model}' is not available")
    code, _ = _grpc_error(lambda: stub.ModelInfer(_infer_message(model)))
    assert code == grpc.StatusCode.NOT_FOUND
    for name in (model, "nosuch"):
        assert not stub.ModelReady(service_pb2.ModelReadyRequest(name=name)).ready
    assert stub.ModelReady(service_pb2.ModelReadyRequest(name="add_sub")).ready


def _index(server: ServerProcess, name: str) -> dict[str, tuple[str, str]]:
    status, _, reply = request(server.http_url, "POST", "/v2/repository/index", b"{}")
    assert status == 200
    return {
        e.get("version", ""): (e.get("state", ""), e.get("reason", ""))
        for e in json.loads(reply)
        if e["name"] == name
    }


def test_explicit_load_and_reload_with_a_version_that_fails(
    coreserve_server: ServerFactory, tmp_path: Path
) -> None:
    _write_two_versions(tmp_path, "pair", second_works=False)
    server = coreserve_server(tmp_path, "--model-control-mode=explicit")
    # Load: version 2 fails, so version 1 is unloaded too.
    status, message = _get(server, "POST", "/v2/repository/models/pair/load")
    assert status == 400 and message.startswith(
        "load failed for model 'pair': version 2 is at UNAVAILABLE state"
    )
    assert _index(server, "pair")["1"] == ("UNAVAILABLE", "unloaded")
    assert _get(server, "POST", "/v2/models/pair/infer", GOOD)[0] == 404
    # Both versions load once version 2 works.
    _write_two_versions(tmp_path, "pair", second_works=True)
    assert _get(server, "POST", "/v2/repository/models/pair/load") == (200, "")
    assert {v: s for v, (s, _) in _index(server, "pair").items()} == {"1": "READY", "2": "READY"}
    # A reload whose version 2 fails keeps both served versions, as Triton does.
    _write_two_versions(tmp_path, "pair", second_works=False)
    status, message = _get(server, "POST", "/v2/repository/models/pair/load")
    assert status == 400 and "the loaded version keeps serving" in message
    for version in ("1", "2"):
        assert _get(server, "POST", f"/v2/models/pair/versions/{version}/infer", GOOD)[0] == 200
    assert "Traceback" not in server.log


def test_poll_mode_serves_no_half_loaded_model(coreserve_server: ServerFactory, tmp_path: Path) -> None:
    repository = tmp_path / "models"
    write_model(repository, "add_sub", add_sub_model("FP32", ["batch", 4]), ADD_SUB)
    server = coreserve_server(repository, "--model-control-mode=poll", "--repository-poll-secs=0.3")
    # Written aside and moved in whole: a poll between writing version 2 and breaking it would
    # load both, and the failing reload after keeps them served.
    _write_two_versions(tmp_path / "staging", "late", second_works=False)
    (tmp_path / "staging" / "late").rename(repository / "late")
    wait_until(lambda: len(_index(server, "late")) == 2, "the poll finds both versions of the added model")
    index = _index(server, "late")
    assert index["1"] == ("UNAVAILABLE", "unloaded") and index["2"][0] == "UNAVAILABLE"
    assert _get(server, "GET", "/v2/models/late/ready") == (400, "Model version not ready")
    _serves(server)
    assert "Traceback" not in server.log


# --- 4. priority -----------------------------------------------------------------------------

UNSIGNED_TEXT = "Unable to parse '{}': attempt to access JSON non-unsigned-integer as unsigned-integer"


@pytest.mark.parametrize("name", ["priority", "timeout"])
@pytest.mark.parametrize("value", [-1, 1.5, "2", True, None, [1], {}])
def test_http_priority_and_timeout_must_be_unsigned_integers(
    server: ServerProcess, name: str, value: Any
) -> None:
    body = json.dumps({"inputs": TENSORS, "parameters": {name: value}}).encode()
    status, message = _get(server, "POST", "/v2/models/add_sub/infer", body)
    assert status == 400 and message.startswith(UNSIGNED_TEXT.format(name)), message
    _serves(server)


@pytest.mark.parametrize(
    ("parameters", "text"),
    [
        ({"sequence_start": 1}, "Unable to parse 'sequence_start': attempt to access JSON non-boolean as boolean"),
        ({"sequence_end": "yes"}, "Unable to parse 'sequence_end': attempt to access JSON non-boolean as boolean"),
        ({"sequence_id": -1}, "Unable to parse 'sequence_id': attempt to access JSON non-string as string"),
        ({"binary_data_output": "true"},
         "Unable to parse 'binary_data_output': attempt to access JSON non-boolean as boolean"),
        ({"triton_x": 1}, "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."),
    ],
)  # fmt: skip
def test_http_parameters_triton_reads_itself_are_checked_as_there(
    server: ServerProcess, parameters: dict[str, Any], text: str
) -> None:
    body = json.dumps({"inputs": TENSORS, "parameters": parameters}).encode()
    status, message = _get(server, "POST", "/v2/models/add_sub/infer", body)
    assert status == 400 and message.startswith(text), message
    taken = {"sequence_id": "s-1", "sequence_start": False, "binary_data_output": False, "other": 1}
    body = json.dumps({"inputs": TENSORS, "parameters": taken}).encode()
    assert _get(server, "POST", "/v2/models/add_sub/infer", body) == (200, "")


def test_priorities_beyond_the_levels_get_the_default(
    server: ServerProcess, stub: service_pb2_grpc.GRPCInferenceServiceStub
) -> None:
    for priority in (0, 1, 7, 2**63 - 1):
        body = json.dumps({"inputs": TENSORS, "parameters": {"priority": priority}}).encode()
        assert _get(server, "POST", "/v2/models/add_sub/infer", body) == (200, "")
        for field in ("int64_param", "uint64_param"):
            reply = stub.ModelInfer(_infer_message(priority=(field, priority)))
            assert reply.model_name == "add_sub"


def test_grpc_priority_must_be_a_non_negative_integer(
    server: ServerProcess, stub: service_pb2_grpc.GRPCInferenceServiceStub
) -> None:
    code, message = _grpc_error(lambda: stub.ModelInfer(_infer_message(priority=("int64_param", -1))))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert message.startswith("invalid value for 'priority', expected value >= 0.")
    for wrong in (("double_param", 1.5), ("string_param", "2"), ("bool_param", True)):
        code, message = _grpc_error(lambda wrong=wrong: stub.ModelInfer(_infer_message(priority=wrong)))
        assert (code, message) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "invalid value type for 'priority' parameter, expected int64_param or uint64_param.",
        )
    _serves(server)


@pytest.mark.parametrize(
    ("key", "value", "text"),
    [
        ("sequence_id", ("bool_param", True), "invalid value type for 'sequence_id' parameter, expected int64_param or string_param."),
        ("sequence_id", ("uint64_param", 7), "invalid value type for 'sequence_id' parameter, expected int64_param or string_param."),
        ("sequence_start", ("int64_param", 1), "invalid value type for 'sequence_start' parameter, expected bool_param."),
        ("sequence_end", ("string_param", "y"), "invalid value type for 'sequence_end' parameter, expected bool_param."),
        ("triton_enable_empty_final_response", ("string_param", "true"),
         "invalid value type for 'triton_enable_empty_final_response' parameter, expected bool_param."),
        ("triton_foo", ("bool_param", True),
         "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following keys "
         "starting with 'triton_' are allowed: triton_enable_empty_final_response"),
        ("foo", ("uint64_param", 5), "invalid value type for 'foo' parameter, expected int64_param, bool_param, or string_param."),
    ],
)  # fmt: skip
def test_grpc_parameters_of_a_type_triton_refuses_are_refused_in_its_words(
    server: ServerProcess,
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
    key: str,
    value: tuple[str, Any],
    text: str,
) -> None:
    code, message = _grpc_error(lambda: stub.ModelInfer(_infer_message(**{key: value})))
    assert (code, message) == (grpc.StatusCode.INVALID_ARGUMENT, text)
    # What Triton takes: any other key of int64, bool, string or double, and these of their types.
    taken = {"foo": ("double_param", 1.5), "bar": ("string_param", "x"), "sequence_start": ("bool_param", False),
             "triton_enable_empty_final_response": ("bool_param", True)}  # fmt: skip
    assert stub.ModelInfer(_infer_message(**taken)).model_name == "add_sub"


def test_grpc_timeout_must_be_an_int64_param(
    server: ServerProcess, stub: service_pb2_grpc.GRPCInferenceServiceStub
) -> None:
    for wrong in (("uint64_param", 5), ("double_param", 1.5), ("string_param", "2"), ("bool_param", True)):
        code, message = _grpc_error(lambda wrong=wrong: stub.ModelInfer(_infer_message(timeout=wrong)))
        assert (code, message) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "invalid value type for 'timeout' parameter, expected int64_param.",
        )
    for fine in (5_000_000, -5):  # as Triton: any int64 (a negative one reads as a long time)
        assert stub.ModelInfer(_infer_message(timeout=("int64_param", fine))).model_name == "add_sub"
    _serves(server)
