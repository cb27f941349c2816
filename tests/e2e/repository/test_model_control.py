"""Explicit model control: the repository API over HTTP and gRPC, its safety, and restrictions."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.protos import grpc_service_pb2, grpc_service_pb2_grpc
from coreserve.testing import ServerFactory, ServerProcess
from support.model_builders import (
    add_sub_model,
    pipeline_config,
    scale_model,
    write_echo_that_loads,
    write_model,
)
from support.waiting import wait_until
from support.wire.http_raw import request

SCALE = """
backend: "onnxruntime"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
ADD_SUB = """
backend: "onnxruntime"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
PIPELINE = pipeline_config(4)


OUTER = """
platform: "ensemble"
max_batch_size: 4
input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "TOTAL" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [ { model_name: "pipeline" model_version: -1
  input_map { key: "A" value: "A" } input_map { key: "B" value: "B" }
  output_map { key: "TOTAL" value: "TOTAL" } } ] }
"""
PAIR = """
platform: "ensemble"
max_batch_size: 4
input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "add_sub" model_version: -1 input_map { key: "INPUT0" value: "A" }
    input_map { key: "INPUT1" value: "B" } output_map { key: "OUTPUT0" value: "sum" } },
  { model_name: "other" model_version: -1 input_map { key: "INPUT0" value: "sum" }
    output_map { key: "OUTPUT0" value: "OUT" } } ] }
"""
# The pipeline with its output named TOTAL, as a load request's configuration.
TENSOR = {"data_type": "TYPE_FP32", "dims": [4]}
PIPELINE_AS_TOTAL = {
    "name": "pipeline",
    "platform": "ensemble",
    "max_batch_size": 4,
    "input": [{"name": "A", **TENSOR}, {"name": "B", **TENSOR}],
    "output": [{"name": "TOTAL", **TENSOR}],
    "ensemble_scheduling": {
        "step": [
            {
                "model_name": "add_sub",
                "model_version": -1,
                "input_map": {"INPUT0": "A", "INPUT1": "B"},
                "output_map": {"OUTPUT0": "TOTAL"},
            }
        ]
    },
}


def _scale(client: httpclient.InferenceServerClient, model: str = "scaled") -> float:
    tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    return float(client.infer(model, [tensor]).as_numpy("OUTPUT0")[0, 0])


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    write_model(root, "scaled", scale_model(2.0), SCALE)
    write_model(root, "other", scale_model(3.0), SCALE)
    write_model(root, "add_sub", add_sub_model("FP32", ["batch", 4]), ADD_SUB)
    (root / "pipeline" / "1").mkdir(parents=True)
    (root / "pipeline" / "config.pbtxt").write_text(PIPELINE)
    return root


@pytest.fixture
def server(coreserve_server: ServerFactory, repository: Path, tmp_path: Path) -> ServerProcess:
    return coreserve_server(
        repository,
        "--model-control-mode=explicit",
        "--load-model=scaled",
        f"--model-cache-dir={tmp_path / 'cache'}",
    )


@pytest.fixture
def client(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.http_url)
    yield client
    client.close()


def _states(client: httpclient.InferenceServerClient) -> dict[str, tuple[str, str]]:
    return {
        entry["name"]: (entry.get("state", ""), entry.get("reason", ""))
        for entry in client.get_model_repository_index()
    }


def test_only_the_named_models_load_at_start(client: httpclient.InferenceServerClient) -> None:
    states = _states(client)
    assert states["scaled"] == ("READY", "")
    assert states["other"] == ("", "")  # never loaded: its name alone, as Triton lists it
    assert {"name": "other"} in client.get_model_repository_index()
    assert _scale(client) == 2.0
    with pytest.raises(
        InferenceServerException, match="Request for unknown model: 'other' is not found"
    ) as info:
        _scale(client, "other")
    assert info.value.status() == "404"
    assert [
        entry["name"] for entry in client.get_model_repository_index() if entry.get("state") == "READY"
    ] == ["scaled"]


def test_load_and_unload_over_http_and_grpc(
    client: httpclient.InferenceServerClient, server: ServerProcess
) -> None:
    client.load_model("other")
    assert client.is_model_ready("other") and _scale(client, "other") == 3.0
    client.unload_model("other")
    assert _states(client)["other"] == ("UNAVAILABLE", "unloaded")
    # The index lists the version it unloaded, as Triton's does.
    assert [e for e in client.get_model_repository_index() if e["name"] == "other"] == [
        {"name": "other", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
    ]
    # Triton keeps an unloaded model, with no version: not "not found" as a model never loaded.
    with pytest.raises(
        InferenceServerException, match="Request for unknown model: 'other' has no available versions"
    ) as info:
        _scale(client, "other")
    assert info.value.status() == "404"
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        grpc.load_model("other")
        assert grpc.is_model_ready("other")
        ready = {m.name for m in grpc.get_model_repository_index().models if m.state == "READY"}
        assert ready == {"scaled", "other"}
        grpc.unload_model("other")
        assert grpc.is_model_ready("scaled") and not {
            m.name for m in grpc.get_model_repository_index().models if m.state == "READY"
        } - {"scaled"}
        with pytest.raises(InferenceServerException) as info:
            grpc.load_model("missing")
        assert info.value.status() == "StatusCode.INTERNAL"  # as Triton 2.51 answers it
    finally:
        grpc.close()


def test_load_with_a_config_override(client: httpclient.InferenceServerClient) -> None:
    config = json.loads(
        json.dumps(
            {
                "backend": "onnxruntime",
                "max_batch_size": 2,
                "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
                "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
            }
        )
    )
    client.load_model("other", config=json.dumps(config))
    assert client.get_model_config("other")["max_batch_size"] == 2
    with pytest.raises(InferenceServerException, match="not valid JSON"):
        client.load_model("other", config="{not json")
    assert client.is_model_ready("other")  # the failed load left the served one alone
    # Keys left unquoted, as protobuf's JSON parser (Triton's) takes them (its QA
    # L0_iterative_sequence writes `direct: {...}`); a string that looks like one is left alone.
    noted = {**config, "parameters": {"note": {"string_value": "key: value"}}}
    unquoted = json.dumps(noted).replace('"max_batch_size": 2', "max_batch_size: 3")
    client.load_model("other", config=unquoted)
    served = client.get_model_config("other")
    assert served["max_batch_size"] == 3 and served["parameters"]["note"]["string_value"] == "key: value"


def test_a_plain_load_of_unchanged_files_keeps_what_serves_as_triton(
    client: httpclient.InferenceServerClient, server: ServerProcess, repository: Path
) -> None:
    """A configuration a load gave stays until the files change (checked side by side)."""
    given = {
        "backend": "onnxruntime",
        "max_batch_size": 2,
        "input": [{"name": "INPUT0", **TENSOR}],
        "output": [{"name": "OUTPUT0", **TENSOR}],
    }
    client.load_model("other", config=json.dumps(given))
    client.load_model("other")
    assert client.get_model_config("other")["max_batch_size"] == 2
    assert server.log.count("model 'other' is loaded from these files already: nothing to reload") == 1
    config = repository / "other" / "config.pbtxt"
    os.utime(config, ns=(config.stat().st_atime_ns, config.stat().st_mtime_ns + 10**9))
    client.load_model("other")  # its files changed: loaded from them
    assert client.get_model_config("other")["max_batch_size"] == 4
    for _ in range(2):  # an ensemble loads again: it takes its steps' reloads so
        client.load_model("pipeline")
    assert "model 'pipeline' is loaded from these files already" not in server.log


def test_load_from_files_writes_nothing_into_the_repository(
    client: httpclient.InferenceServerClient, repository: Path, tmp_path: Path
) -> None:
    before = sorted(str(p) for p in repository.rglob("*"))
    config = json.dumps(
        {
            "backend": "onnxruntime",
            "max_batch_size": 4,
            "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
            "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
        }
    )
    client.load_model(
        "uploaded", config=config, files={"file:1/model.onnx": scale_model(7.0).SerializeToString()}
    )
    assert _scale(client, "uploaded") == 7.0
    assert sorted(str(p) for p in repository.rglob("*")) == before
    client.unload_model("uploaded")


@pytest.mark.parametrize("name", ["..", "a%2Fb", ".hidden", "%00nul", "a%5Cb"])
def test_model_names_that_leave_the_repository_are_refused(
    server: ServerProcess, tmp_path: Path, name: str
) -> None:
    body = json.dumps(
        {
            "parameters": {
                "config": json.dumps({"backend": "onnxruntime"}),
                "file:1/model.onnx": base64.b64encode(b"x").decode(),
            }
        }
    ).encode()
    status, _, reply = request(server.http_url, "POST", f"/v2/repository/models/{name}/load", body)
    assert status == 400, reply
    assert "not a valid model name" in json.loads(reply)["error"]
    assert not (tmp_path / "cache" / "overrides").exists()  # nothing was written


def test_a_model_name_no_folder_can_have_is_a_client_error_and_a_short_unknown_one_tritons(
    server: ServerProcess,
) -> None:
    """A load of an unknown model is Triton's INTERNAL (500); of a name longer than any folder's
    (255 bytes) it is the client's mistake (400, saying so) over HTTP and gRPC alike."""
    status, _, reply = request(server.http_url, "POST", "/v2/repository/models/nosuch/load", b"")
    assert status == 500 and "failed to poll from model repository" in json.loads(reply)["error"]
    long_name = "a" * 300
    status, _, reply = request(server.http_url, "POST", f"/v2/repository/models/{long_name}/load", b"")
    assert status == 400, reply
    assert "no model folder has a name of 300 bytes (at most 255)" in json.loads(reply)["error"]
    with (
        grpcclient.InferenceServerClient(server.grpc_url) as grpc_client,
        pytest.raises(InferenceServerException) as info,
    ):
        grpc_client.load_model(long_name)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    status, _, _ = request(server.http_url, "GET", "/v2/models/scaled/ready")
    assert status == 200 and "Traceback" not in server.log


BAD_FILES = [
    "file:../escape.onnx",
    "file:/etc/passwd",
    "file:1/../../escape",
    "file:1/\u0000x",
    "file:",
    "file:1//x",
]


@pytest.mark.parametrize("key", BAD_FILES)
def test_file_paths_that_leave_the_model_folder_are_refused(
    server: ServerProcess, tmp_path: Path, key: str
) -> None:
    body = json.dumps(
        {
            "parameters": {
                "config": json.dumps({"backend": "onnxruntime"}),
                "file:1/model.onnx": base64.b64encode(b"x").decode(),
                key: base64.b64encode(b"payload").decode(),
            }
        }
    ).encode()
    status, _, reply = request(server.http_url, "POST", "/v2/repository/models/uploaded/load", body)
    assert status == 400 and "is not a relative path inside the model's folder" in json.loads(reply)["error"]
    assert not (tmp_path / "cache" / "overrides").exists()  # nothing was written
    assert not (tmp_path / "escape.onnx").exists()


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"config": 5}, "invalid value type for load parameter 'config', expected string_param."),
        (
            {"file:1/model.onnx": "bm90IGJhc2U2NA=="},
            "failed to load 'other', failed to poll from model repository: "
            "Load parameter 'config' must be specified for model file override",
        ),
        ({"file:1/model.onnx": "%%%"}, "not valid base64"),
        ({"colour": "blue"}, "unrecognized load parameter 'colour'."),
    ],
)
def test_bad_load_parameters(server: ServerProcess, parameters: dict, message: str) -> None:
    body = json.dumps({"parameters": parameters}).encode()
    status, _, reply = request(server.http_url, "POST", "/v2/repository/models/other/load", body)
    assert status == 400 and message in json.loads(reply)["error"]


def test_loading_an_ensemble_loads_its_steps_and_unload_dependents(
    client: httpclient.InferenceServerClient,
) -> None:
    client.load_model("pipeline")
    assert client.is_model_ready("add_sub") and client.is_model_ready("pipeline")
    client.unload_model("add_sub", unload_dependents=True)
    states = _states(client)
    assert states["add_sub"] == ("UNAVAILABLE", "unloaded") and states["pipeline"] == (
        "UNAVAILABLE",
        "unloaded",
    )


def test_an_ensemble_goes_with_its_model_and_comes_back_with_it(
    client: httpclient.InferenceServerClient, server: ServerProcess
) -> None:
    """As Triton 2.51 (checked side by side): with or without unload_dependents the ensemble is
    unloaded too, and loads again when its model does; one unloaded by name stays unloaded."""
    client.load_model("pipeline")
    client.unload_model("add_sub", unload_dependents=True)
    assert _states(client)["pipeline"] == ("UNAVAILABLE", "unloaded")
    client.load_model("add_sub")
    assert client.is_model_ready("pipeline")
    client.unload_model("add_sub")
    assert _states(client)["pipeline"] == ("UNAVAILABLE", "unloaded")
    assert not client.is_model_ready("pipeline")
    assert "ensemble pipeline contains models that are not available or ambiguous: add_sub" in server.log
    client.load_model("add_sub")
    assert _sum(client, "pipeline") == [[2.0] * 4]
    client.unload_model("add_sub")
    client.unload_model("pipeline")  # by name: it stays unloaded
    client.load_model("add_sub")
    assert _states(client)["pipeline"] == ("UNAVAILABLE", "unloaded")


def test_ensembles_of_ensembles_and_of_several_models_come_back_when_all_they_use_serves(
    client: httpclient.InferenceServerClient, repository: Path
) -> None:
    (repository / "outer" / "1").mkdir(parents=True)
    (repository / "outer" / "config.pbtxt").write_text(OUTER)
    (repository / "pair" / "1").mkdir(parents=True)
    (repository / "pair" / "config.pbtxt").write_text(PAIR)
    # Loaded with its configuration in the request: it comes back with that one.
    client.load_model("pipeline", config=json.dumps(PIPELINE_AS_TOTAL))
    client.load_model("outer")
    client.load_model("pair")
    client.unload_model("add_sub")
    states = _states(client)
    assert [states[name] for name in ("pipeline", "outer", "pair")] == [("UNAVAILABLE", "unloaded")] * 3
    client.unload_model("other")  # one of pair's models, unloaded by name: it stays so
    client.load_model("add_sub")
    states = _states(client)
    assert client.is_model_ready("pipeline") and client.is_model_ready("outer")
    assert states["pair"] == states["other"] == ("UNAVAILABLE", "unloaded")
    assert [output["name"] for output in client.get_model_metadata("pipeline")["outputs"]] == ["TOTAL"]
    assert _sum(client, "outer", "TOTAL") == [[2.0] * 4]
    client.load_model("other")
    assert _sum(client, "pair", "OUT") == [[6.0] * 4]  # (1 + 1) * 3


def test_a_poll_that_finds_a_cycle_keeps_what_serves_and_a_cycle_broken_loads(
    coreserve_server: ServerFactory, repository: Path
) -> None:
    """A cycle may run through a serving ensemble the poll does not load again; models left
    unavailable by a cycle load once it is broken, even those whose files did not change."""
    outer_of_sum = OUTER.replace('output_map { key: "TOTAL"', 'output_map { key: "SUM"')
    (repository / "outer" / "1").mkdir(parents=True)
    (repository / "outer" / "config.pbtxt").write_text(outer_of_sum)
    server = coreserve_server(repository, "--model-control-mode=poll", "--repository-poll-secs=0.3")
    pipeline_of_outer = (
        PIPELINE.replace('"add_sub"', '"outer"')
        .replace('key: "INPUT0" value: "A"', 'key: "A" value: "A"')
        .replace('key: "INPUT1" value: "B"', 'key: "B" value: "B"')
        .replace('key: "OUTPUT0" value: "SUM"', 'key: "TOTAL" value: "SUM"')
    )
    with httpclient.InferenceServerClient(server.http_url) as client:
        assert _sum(client, "outer", "TOTAL") == [[2.0] * 4]
        (repository / "pipeline" / "config.pbtxt").write_text(pipeline_of_outer)  # outer is not changed
        wait_until(
            lambda: "circular dependency between ensembles: pipeline -> outer -> pipeline" in server.log,
            "the poll finds the cycle",
        )
        assert "model 'pipeline' did not reload, the loaded version keeps serving" in server.log
        assert _sum(client, "pipeline") == [[2.0] * 4] and _sum(client, "outer", "TOTAL") == [[2.0] * 4]
    # From the start in a cycle: both unavailable; then outer alone changes, and both load.
    (repository / "outer" / "config.pbtxt").write_text(outer_of_sum.replace('"pipeline"', '"outer"'))
    args = ("--model-control-mode=poll", "--repository-poll-secs=0.3", "--exit-on-error=false")
    server = coreserve_server(repository, *args)
    with httpclient.InferenceServerClient(server.http_url) as client:
        assert "circular dependency" in _states(client)["pipeline"][1]
        outer_of_add_sub = (
            OUTER.replace('"pipeline"', '"add_sub"')
            .replace(
                'input_map { key: "A" value: "A" } input_map { key: "B" value: "B" }',
                'input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "B" }',
            )
            .replace('output_map { key: "TOTAL"', 'output_map { key: "OUTPUT0"')
        )
        (repository / "outer" / "config.pbtxt").write_text(outer_of_add_sub)
        wait_until(lambda: client.is_model_ready("pipeline"), "the poll loads what the cycle held back")
        assert _sum(client, "pipeline") == [[2.0] * 4]


def test_a_poll_tries_a_model_that_failed_again_only_once_its_files_change(
    coreserve_server: ServerFactory, tmp_path: Path
) -> None:
    """Triton 2.51 loads a model that failed again at every poll (and logs its failure each
    time); here the next try waits for its files to change (docs/triton-differences.md)."""
    root = tmp_path / "models"
    write_model(root, "broken", scale_model(2.0), SCALE.replace('"INPUT0"', '"NOT_AN_INPUT"'))
    args = ("--model-control-mode=poll", "--repository-poll-secs=0.2", "--exit-on-error=false")
    server = coreserve_server(root, *args)
    with httpclient.InferenceServerClient(server.http_url) as client:
        for name in ("first", "second", "third"):  # each a poll at least, after the failed load
            write_model(root, name, scale_model(3.0), SCALE)
            wait_until(lambda name=name: client.is_model_ready(name), f"a poll loads {name}")
        assert server.log.count("loading model 'broken' from") == 1, server.log
        (root / "broken" / "config.pbtxt").write_text(SCALE)
        wait_until(lambda: client.is_model_ready("broken"), "the poll loads the mended files")


def _sum(client: httpclient.InferenceServerClient, model: str, output: str = "SUM") -> list[list[float]]:
    tensors = [httpclient.InferInput(name, [1, 4], "FP32") for name in ("A", "B")]
    for tensor in tensors:
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    result: list[list[float]] = client.infer(model, tensors).as_numpy(output).tolist()
    return result


def test_unload_dependents_of_another_type_is_refused_over_grpc_and_nothing_unloads(
    server: ServerProcess, client: httpclient.InferenceServerClient
) -> None:
    client.load_model("pipeline")
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = grpc_service_pb2_grpc.GRPCInferenceServiceStub(channel)
        unload = grpc_service_pb2.RepositoryModelUnloadRequest(model_name="add_sub")
        unload.parameters["unload_dependents"].string_param = "true"
        with pytest.raises(grpc.RpcError) as info:
            stub.RepositoryModelUnload(unload, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # Triton's code and words
    assert (
        info.value.details() == "invalid value type for 'unload_dependents' parameter, expected bool_param."
    )
    assert client.is_model_ready("add_sub") and client.is_model_ready("pipeline")


def test_a_repository_named_is_refused_as_triton_refuses_it(
    server: ServerProcess, client: httpclient.InferenceServerClient
) -> None:
    words = "'repository_name' specification is not supported"  # Triton's, with 501 / UNIMPLEMENTED
    for path in ("/v2/repository/models/index", "/v2/repository/r/models/add_sub/load",
                 "/v2/repository/r/models/scaled/unload"):  # fmt: skip
        status, _, reply = request(server.http_url, "POST", path, b"")
        assert (status, json.loads(reply)) == (501, {"error": words}), path
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = grpc_service_pb2_grpc.GRPCInferenceServiceStub(channel)
        calls = [
            (stub.RepositoryIndex, grpc_service_pb2.RepositoryIndexRequest(repository_name="r")),
            (stub.RepositoryModelLoad, grpc_service_pb2.RepositoryModelLoadRequest(repository_name="r", model_name="add_sub")),
            (stub.RepositoryModelUnload, grpc_service_pb2.RepositoryModelUnloadRequest(repository_name="r", model_name="scaled")),
        ]  # fmt: skip
        for call, message in calls:
            with pytest.raises(grpc.RpcError) as info:
                call(message, timeout=30)
            assert (info.value.code(), info.value.details()) == (grpc.StatusCode.UNIMPLEMENTED, words)
    assert client.is_model_ready("scaled") and not client.is_model_ready("add_sub")  # nothing changed


def test_an_ensemble_whose_step_no_repository_holds_is_refused_in_tritons_words(
    server: ServerProcess, repository: Path
) -> None:
    (repository / "ens_missing" / "1").mkdir(parents=True)
    (repository / "ens_missing" / "config.pbtxt").write_text(OUTER.replace('"pipeline"', '"nosuch"'))
    status, _, reply = request(server.http_url, "POST", "/v2/repository/models/ens_missing/load", b"")
    assert (status, json.loads(reply)["error"]) == (
        400,
        "load failed for model 'ens_missing': ensemble ens_missing contains models that are not available "
        "or ambiguous: nosuch",
    )


def test_a_failed_reload_keeps_the_served_version(
    client: httpclient.InferenceServerClient, repository: Path
) -> None:
    (repository / "scaled" / "2").mkdir()
    (repository / "scaled" / "2" / "model.onnx").write_bytes(b"broken model")
    with pytest.raises(InferenceServerException, match="the loaded version keeps serving") as info:
        client.load_model("scaled")
    assert "onnxruntime cannot load" in info.value.message()
    assert _scale(client) == 2.0 and client.get_model_metadata("scaled")["versions"] == ["1"]


def test_a_start_up_name_no_repository_has_is_listed_and_the_server_is_ready(
    coreserve_server: ServerFactory, repository: Path
) -> None:
    """As Triton with --exit-on-error=false: the name never becomes a model, so the server is ready."""
    server = coreserve_server(
        repository, "--model-control-mode=explicit", "--load-model=scaled", "--load-model=nowhere",
        "--exit-on-error=false",
    )  # fmt: skip
    assert request(server.http_url, "GET", "/v2/health/ready", b"")[0] == 200
    with httpclient.InferenceServerClient(server.http_url) as client:
        assert _states(client)["nowhere"] == ("UNAVAILABLE", "model 'nowhere' is not in the repository")
    # With --exit-on-error (the default) the start fails, as Triton's does.
    failing = ServerProcess([repository], ["--model-control-mode=explicit", "--load-model=nowhere"])
    failing.start(wait_for=[])
    assert failing.wait(timeout=60) == 1
    assert "exiting because --exit-on-error is true" in failing.log
    failing.close()


def test_model_control_needs_explicit_mode(coreserve_server: ServerFactory, repository: Path) -> None:
    server = coreserve_server(repository)
    status, _, reply = request(server.http_url, "POST", "/v2/repository/models/other/unload", b"")
    message = json.loads(reply)["error"]  # Triton's status and words, then the way out
    assert status == 503 and message.startswith(
        "explicit model load / unload is not allowed if polling is enabled (unloading models needs "
        "--model-control-mode=explicit; this server runs in mode none)"
    )
    with grpc.insecure_channel(server.grpc_url) as channel, pytest.raises(grpc.RpcError) as info:
        load = grpc_service_pb2.RepositoryModelLoadRequest(model_name="other")
        grpc_service_pb2_grpc.GRPCInferenceServiceStub(channel).RepositoryModelLoad(load)
    assert info.value.code() is grpc.StatusCode.UNAVAILABLE
    assert "explicit model load / unload is not allowed if polling is enabled (loading models" in str(
        info.value.details()
    )


def test_restricted_model_repository_api(coreserve_server: ServerFactory, repository: Path) -> None:
    server = coreserve_server(
        repository,
        "--model-control-mode=explicit",
        "--load-model=*",
        "--http-restricted-api=model-repository:admin-key=secret",
        "--grpc-restricted-api=model-repository,statistics:admin-key=secret",
    )
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as info:
            http.unload_model("other")
        assert info.value.status() == "403"  # Triton's words, then the category
        assert (
            info.value.message() == "This API is restricted, expecting header 'admin-key' (model-repository)"
        )
        with pytest.raises(InferenceServerException, match="restricted") as info:
            http.unload_model("other", headers={"admin-key": "wrong"})
        http.unload_model("other", headers={"admin-key": "secret"})
        assert _scale(http) == 2.0  # inference is not restricted
        with pytest.raises(InferenceServerException) as info:
            grpc.get_inference_statistics("scaled")
        assert info.value.status() == "StatusCode.UNAVAILABLE"  # Triton 2.51's code and words
        assert info.value.message() == (
            "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key' (statistics)"
        )
        secret = {"triton-grpc-protocol-admin-key": "secret"}  # Triton's gRPC form of the header
        assert grpc.get_inference_statistics("scaled", headers=secret).model_stats
        grpc.load_model("other", headers=secret)
        assert grpc.is_model_ready("other")
    finally:
        http.close()
        grpc.close()


def test_bad_restriction_flags_stop_the_start(repository: Path) -> None:
    server = ServerProcess([repository], ["--http-restricted-api=nonsense"])
    with pytest.raises(RuntimeError, match="exited with 2"):
        server.start()
    assert "expected <category>" in server.log
    server.close()
    assert os.path.isdir(repository)


SCALE_JSON = json.dumps(
    {
        "backend": "onnxruntime",
        "max_batch_size": 4,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
    }
)


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({f"file:1/{'n' * 300}.onnx": b"x"}, "has a name of 305 bytes; file systems hold at most 255"),
        ({f"file:1/{'é' * 200}": b"x"}, "has a name of 400 bytes"),
        ({"file:" + "/".join(["d" * 200] * 12): b"x"}, "is longer than 2048 bytes"),
        # The second file needs a folder where the first one is: found only while writing.
        ({"file:1/model.onnx": b"x", "file:1/model.onnx/inner": b"y"}, "cannot be written"),
    ],
    ids=["name too long", "name too long in bytes", "path too long", "paths that clash"],
)
def test_files_no_file_system_holds_are_400_and_leave_nothing(
    server: ServerProcess, tmp_path: Path, files: dict[str, bytes], message: str
) -> None:
    encoded = {key: base64.b64encode(data).decode() for key, data in files.items()}
    parameters = {"config": SCALE_JSON, **encoded}
    body = json.dumps({"parameters": parameters}).encode()
    status, _, reply = request(server.http_url, "POST", "/v2/repository/models/uploaded/load", body)
    assert status == 400, reply
    assert message in json.loads(reply)["error"]
    overrides = tmp_path / "cache" / "overrides"
    assert not overrides.exists() or not any(overrides.iterdir())
    assert "Traceback" not in server.log
    with grpcclient.InferenceServerClient(server.grpc_url) as grpc_client:
        with pytest.raises(InferenceServerException) as info:
            grpc_client.load_model("uploaded", config=SCALE_JSON, files=files)
        assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert message in info.value.message()
    assert not overrides.exists() or not any(overrides.iterdir())


def test_each_server_has_a_cache_of_its_own_removed_at_exit(
    coreserve_server: ServerFactory, repository: Path, tmp_path: Path
) -> None:
    temp = tmp_path / "temp"
    temp.mkdir()
    servers = [
        coreserve_server(repository, "--model-control-mode=explicit", env={"TMPDIR": str(temp)})
        for _ in range(2)
    ]
    for server in servers:
        with httpclient.InferenceServerClient(server.http_url) as client:
            files = {"file:1/model.onnx": scale_model(7.0).SerializeToString()}
            client.load_model("uploaded", config=SCALE_JSON, files=files)
            assert _scale(client, "uploaded") == 7.0
    caches = sorted(temp.glob("coreserve-cache-*"))
    assert len(caches) == 2
    assert all(any((cache / "overrides").iterdir()) for cache in caches)
    for server in servers:
        assert server.stop() == 0
    assert not list(temp.glob("coreserve-cache-*"))


def test_a_cache_folder_given_is_kept_at_exit(
    server: ServerProcess, client: httpclient.InferenceServerClient, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(exist_ok=True)
    (cache / "mine.txt").write_text("the operator's file")
    client.load_model(
        "uploaded", config=SCALE_JSON, files={"file:1/model.onnx": scale_model(7.0).SerializeToString()}
    )
    assert len(list((cache / "overrides").glob("*/1/model.onnx"))) == 1
    assert server.stop() == 0
    # The files of a model loaded from files go with the model; the folder and the rest stay.
    assert (cache / "mine.txt").read_text() == "the operator's file"
    assert not list((cache / "overrides").glob("*.partial"))


def _ensemble_of(step: str) -> str:
    return f"""
platform: "ensemble"
max_batch_size: 4
input [ {{ name: "A" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "B" data_type: TYPE_FP32 dims: [ 4 ] }} ]
ensemble_scheduling {{ step [ {{ model_name: "{step}" model_version: -1
  input_map {{ key: "A" value: "A" }} output_map {{ key: "B" value: "B" }} }} ] }}
"""


@pytest.mark.parametrize(
    ("model", "cycle"),
    [("selfish", "selfish -> selfish"), ("ping", "ping -> pong -> ping"), ("entry", "ping -> pong -> ping")],
)
def test_ensembles_that_form_a_cycle_are_refused_with_the_cycle(
    coreserve_server: ServerFactory, repository: Path, model: str, cycle: str
) -> None:
    for name, step in (("selfish", "selfish"), ("ping", "pong"), ("pong", "ping"), ("entry", "ping")):
        (repository / name / "1").mkdir(parents=True)
        (repository / name / "config.pbtxt").write_text(_ensemble_of(step))
    server = coreserve_server(repository, "--model-control-mode=explicit", "--load-model=scaled")
    status, _, reply = request(server.http_url, "POST", f"/v2/repository/models/{model}/load")
    assert status == 400, reply
    assert f"its steps form a cycle: {cycle}" in json.loads(reply)["error"]
    with grpcclient.InferenceServerClient(server.grpc_url) as grpc_client:
        with pytest.raises(InferenceServerException) as info:
            grpc_client.load_model(model)
        assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert f"its steps form a cycle: {cycle}" in info.value.message()
    with httpclient.InferenceServerClient(server.http_url) as client:
        assert _scale(client) == 2.0  # the server keeps serving
    assert "Traceback" not in server.log


def test_a_load_that_closes_a_cycle_through_serving_models_is_refused(
    client: httpclient.InferenceServerClient, repository: Path
) -> None:
    """Whether the new configuration comes in the request or from the folder: nothing changes,
    and the ensembles that serve go on serving."""
    client.load_model("pipeline")  # pipeline uses add_sub
    add_sub_of_pipeline = {**PIPELINE_AS_TOTAL, "name": "add_sub"}
    add_sub_of_pipeline["ensemble_scheduling"] = {
        "step": [
            {
                "model_name": "pipeline",
                "model_version": -1,
                "input_map": {"A": "A", "B": "B"},
                "output_map": {"SUM": "TOTAL"},
            }
        ]
    }
    why = "circular dependency between ensembles: add_sub -> pipeline -> add_sub"
    with pytest.raises(InferenceServerException) as info:
        client.load_model("add_sub", config=json.dumps(add_sub_of_pipeline))
    assert info.value.status() == "400" and why in info.value.message()
    (repository / "add_sub" / "config.pbtxt").write_text(
        PIPELINE.replace('"add_sub"', '"pipeline"')
        .replace("INPUT0", "A")
        .replace("INPUT1", "B")
        .replace("OUTPUT0", "SUM")
    )
    with pytest.raises(InferenceServerException) as info:
        client.load_model("add_sub")
    assert info.value.status() == "400" and why in info.value.message()
    assert _sum(client, "pipeline") == [[2.0] * 4]


SLOW_STEP = """
import os
import time

import triton_python_backend_utils as pb_utils


FOLDER = FOLDER_OF_THE_TEST


class TritonPythonModel:
    def execute(self, requests):
        open(os.path.join(FOLDER, "started"), "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(FOLDER, "release")) and time.monotonic() < deadline:
            time.sleep(0.01)
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("B", pb_utils.get_input_tensor_by_name(r, "A").as_numpy())])
            for r in requests
        ]
"""


def test_a_load_waits_for_an_unload_of_a_model_it_is_linked_to(
    client: httpclient.InferenceServerClient, repository: Path, server: ServerProcess
) -> None:
    """An unload takes the ensemble down, then waits for its request in flight; a load of the
    ensemble meanwhile used to find its step still served and left the ensemble READY with its
    step unloaded. As in Triton, the load waits for the unload and then loads both."""
    step = repository / "held"
    (step / "1").mkdir(parents=True)
    (step / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 4\n'
        'input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
    )
    (step / "1" / "model.py").write_text(SLOW_STEP.replace("FOLDER_OF_THE_TEST", repr(str(step))))
    (repository / "relay" / "1").mkdir(parents=True)
    (repository / "relay" / "config.pbtxt").write_text(_ensemble_of("held"))
    client.load_model("relay")
    infer = json.dumps({"inputs": [{"name": "A", "shape": [1, 4], "datatype": "FP32", "data": [1.0] * 4}]})
    with ThreadPoolExecutor(3) as pool:  # (the raw client: tritonclient's may not change threads)
        in_flight = pool.submit(request, server.http_url, "POST", "/v2/models/relay/infer", infer.encode())
        wait_until(lambda: (step / "started").exists(), "the request runs in the step")
        unloading = pool.submit(request, server.http_url, "POST", "/v2/repository/models/held/unload", b"")
        wait_until(lambda: "unloading model 'relay'" in server.log, "the unload closes relay")
        loading = pool.submit(request, server.http_url, "POST", "/v2/repository/models/relay/load", b"")
        wait_until(
            lambda: loading.done() or "the load of model 'relay' waits" in server.log,
            "the load is done or waits",
        )
        (step / "release").touch()
        assert [future.result(timeout=60)[0] for future in (in_flight, unloading, loading)] == [200] * 3
    assert client.is_model_ready("held") and client.is_model_ready("relay")
    assert json.loads(request(server.http_url, "POST", "/v2/models/relay/infer", infer.encode())[2])[
        "outputs"
    ]


def test_a_step_that_loads_another_step_as_it_starts_does_not_wait_for_the_load_that_runs_it(
    client: httpclient.InferenceServerClient, repository: Path
) -> None:
    """Its load is the model's, not a client's: it does not wait for the ensemble's load (which
    waits for it), where a client's load of a linked model would."""
    write_echo_that_loads(repository, "first", loads="second")
    write_echo_that_loads(repository, "second")
    (repository / "both" / "1").mkdir(parents=True)
    (repository / "both" / "config.pbtxt").write_text(
        _ensemble_of("first").replace(
            'output_map { key: "B" value: "B" } } ] }',
            'output_map { key: "B" value: "mid" } }, { model_name: "second" model_version: -1 '
            'input_map { key: "A" value: "mid" } output_map { key: "B" value: "B" } } ] }',
        )
    )
    client.load_model("both")  # first's initialize loads second, a step of the same ensemble
    assert (
        client.is_model_ready("first") and client.is_model_ready("second") and client.is_model_ready("both")
    )


def test_a_version_folder_named_0_is_served_as_on_triton(
    client: httpclient.InferenceServerClient, repository: Path
) -> None:
    write_model(repository, "zeroth", scale_model(5.0), SCALE, versions=(0,))
    client.load_model("zeroth")
    assert client.get_model_metadata("zeroth")["versions"] == ["0"]
    assert _scale(client, "zeroth") == 5.0
    tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    assert client.infer("zeroth", [tensor], model_version="0").as_numpy("OUTPUT0").tolist() == [[5.0] * 4]
    assert client.is_model_ready("zeroth", "0")
    assert ("zeroth", "0", "READY") in {
        (entry["name"], entry.get("version"), entry.get("state"))
        for entry in client.get_model_repository_index()
    }


GATED_MODEL = """
import os
import time


class TritonPythonModel:
    def initialize(self, args):  # loads once the test opens the gate (bounded: 60 s)
        gate = os.path.join(args["model_repository"], "gate")
        deadline = time.monotonic() + 60
        while not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.05)

    def execute(self, requests):
        return []
"""


def test_a_model_loading_through_the_api_is_listed_loading(
    server: ServerProcess, client: httpclient.InferenceServerClient, repository: Path
) -> None:
    folder = write_model(repository, "gated", None, 'backend: "python"\nmax_batch_size: 0')
    (folder / "1" / "model.py").write_text(GATED_MODEL)
    with ThreadPoolExecutor(1) as pool:  # (the raw client: tritonclient's may not change threads)
        load = pool.submit(request, server.http_url, "POST", "/v2/repository/models/gated/load", b"")
        wait_until(lambda: _states(client).get("gated") == ("LOADING", ""), "the index lists it LOADING")
        (folder / "gate").touch()
        assert load.result(timeout=60)[0] == 200
    assert _states(client)["gated"] == ("READY", "")
