"""Traffic weights between a model's versions: the split, sticky keys, what is never rerouted,
the policy from config.pbtxt, its API over HTTP, gRPC and the command line, and every mistake."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

import coreserve
from coreserve.protos import grpc_service_pb2, grpc_service_pb2_grpc, traffic_pb2, traffic_pb2_grpc
from coreserve.testing import ServerFactory, ServerProcess
from support.waiting import wait_until
from support.wire.http_raw import request

from .conftest import SCALED, write_versions

ONES = np.ones((1, 4), np.float32)
ONLY_VERSION_2 = SCALED.replace(
    "version_policy: { all { } }", "version_policy: { specific { versions: [2] } }"
)


def _version_of(output: np.ndarray) -> int:
    """Which version answered: version V multiplies the input by V."""
    return int(output.reshape(-1)[0])


@pytest.fixture
def server(coreserve_server: ServerFactory, repository: Path) -> ServerProcess:
    return coreserve_server(repository)


@pytest.fixture
def client(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.http_url)
    yield client
    client.close()


def _infer(client: httpclient.InferenceServerClient, version: str = "", key: str | None = None) -> int:
    tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(ONES)
    headers = {"coreserve-traffic-key": key} if key is not None else None
    result = client.infer("scaled", [tensor], model_version=version, headers=headers)
    return _version_of(result.as_numpy("OUTPUT0"))


def _set(server: ServerProcess, policy: object) -> tuple[int, dict]:
    body = json.dumps(policy).encode() if not isinstance(policy, bytes) else policy
    status, _, answer = request(server.http_url, "POST", "/v2/repository/models/scaled/traffic", body)
    return status, json.loads(answer)


def _metrics(server: ServerProcess) -> str:
    with urllib.request.urlopen(server.metrics_url, timeout=30) as answer:
        return answer.read().decode()


def _get(server: ServerProcess) -> dict:
    status, _, answer = request(server.http_url, "GET", "/v2/repository/models/scaled/traffic")
    assert status == 200
    return json.loads(answer)


def test_without_a_policy_the_latest_version_serves(server: ServerProcess, client) -> None:
    assert _get(server) == {"weights": {}}
    assert {_infer(client) for _ in range(20)} == {2}


def test_a_90_10_split_over_10000_requests_lands_within_2_points(tmp_path: Path) -> None:
    """In-process, where 10,000 requests take seconds: the routing step is the data plane's,
    the same for every transport."""
    config = SCALED + 'parameters { key: "coreserve_traffic_weights" value: { string_value: "1:90,2:10" } }\n'
    root = write_versions(tmp_path / "models", config=config)
    with coreserve.Server(root, exit_timeout_secs=10) as running:
        model = running.model("scaled")
        served = Counter(_version_of(model.infer({"INPUT0": ONES}).outputs["OUTPUT0"]) for _ in range(10_000))
        per_version = {
            entry["version"]: entry["inference_count"]
            for entry in running.model("scaled").statistics()["model_stats"]
        }
    assert set(served) == {1, 2}
    assert abs(served[1] / 10_000 - 0.90) <= 0.02
    assert per_version == {"1": served[1], "2": served[2]}  # Triton's statistics count each version exactly


def test_sticky_keys_never_change_version_while_the_weights_stand(server: ServerProcess, client) -> None:
    assert _set(server, {"weights": {"1": 50, "2": 50}})[0] == 200
    landed = {key: {_infer(client, key=key) for _ in range(4)} for key in (f"user-{n}" for n in range(40))}
    assert all(len(versions) == 1 for versions in landed.values()), landed
    assert {version for (version,) in landed.values()} == {1, 2}
    # Over gRPC the key is a request parameter, and hashes to the same version.
    with grpcclient.InferenceServerClient(server.grpc_url) as grpc_client:
        for key, (version,) in list(landed.items())[:10]:
            tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
            tensor.set_data_from_numpy(ONES)
            result = grpc_client.infer("scaled", [tensor], parameters={"coreserve_traffic_key": key})
            assert _version_of(result.as_numpy("OUTPUT0")) == version


def test_a_request_that_names_a_version_is_never_rerouted(server: ServerProcess, client) -> None:
    assert _set(server, {"weights": {"2": 100}})[0] == 200
    assert {_infer(client, version="1") for _ in range(20)} == {1}
    assert _set(server, {"weights": {"1": 100}})[0] == 200
    assert {_infer(client) for _ in range(20)} == {1}
    assert {_infer(client, version="2", key="someone") for _ in range(5)} == {2}


def test_the_policy_is_read_set_and_cleared(server: ServerProcess, client) -> None:
    status, answer = _set(server, {"weights": {"1": 25, "2": 75}})
    assert (status, answer) == (200, {"weights": {"1": 25.0, "2": 75.0}})
    assert _get(server) == answer
    metrics = _metrics(server)
    assert 'coreserve_traffic_weight{model="scaled",version="1"} 25' in metrics
    assert 'coreserve_traffic_weight{model="scaled",version="2"} 75' in metrics
    assert _set(server, {}) == (200, {"weights": {}})
    assert {_infer(client) for _ in range(10)} == {2}
    assert "coreserve_traffic_weight" not in _metrics(server)


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ({"weights": {"1": 90, "2": 20}}, "traffic weights must add up to 100, they add up to 110"),
        ({"weights": {"1": 100, "3": 0}}, "traffic policy of model 'scaled' names version 3"),
        ({"weights": {"1": 110, "2": -10}}, "weight of version 1 must be a number from 0 to 100, got 110"),
        ({"weights": {"1": 50, "2": "half"}}, "weight of version 2: 'half' is not a number"),
        ({"weights": {"one": 100}}, "traffic weights: 'one' is not a version number (>= 0)"),
        ({"weights": [1, 2]}, "traffic 'weights' must be an object of version: percent"),
        ({"weights": {"1": 100}, "mirror": {}}, "unknown traffic policy field 'mirror'"),
        ({"shadow": {"version": "2", "share": 0}}, "shadow share must be above 0"),
        ({"shadow": {"version": "7"}}, "names version 7, which the model does not serve"),
        (
            {"shadow": "2"},
            'traffic \'shadow\' must be {"version": "V", "share": percent, "max_in_flight": N}',
        ),
        (
            {"shadow": {"version": "2", "max_in_flight": 0}},
            "shadow max_in_flight must be a whole number from 1",
        ),
        (b"{not json", "malformed JSON in the traffic policy"),
        (b"[1]", "the traffic policy must be a JSON object"),
    ],
)
def test_every_mistake_is_refused_whole(server: ServerProcess, client, policy: object, message: str) -> None:
    assert _set(server, {"weights": {"1": 100}})[0] == 200
    status, answer = _set(server, policy)
    assert status == 400
    assert message in answer["error"]
    assert _get(server) == {"weights": {"1": 100.0}}  # nothing half applied
    assert _infer(client) == 1
    assert "Traceback" not in server.log


def test_an_unknown_model_is_not_found(server: ServerProcess) -> None:
    status, _, answer = request(server.http_url, "POST", "/v2/repository/models/nope/traffic", b"{}")
    assert status == 404 and "nope" in json.loads(answer)["error"]


def test_grpc_reads_and_sets_the_policy_with_the_same_words(server: ServerProcess, client) -> None:
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = traffic_pb2_grpc.TrafficServiceStub(channel)
        answer = stub.ModelTraffic(
            traffic_pb2.ModelTrafficRequest(model_name="scaled", policy_json='{"weights": {"1": 100}}')
        )
        assert json.loads(answer.policy_json) == {"weights": {"1": 100.0}}
        assert _infer(client) == 1
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelTraffic(
                traffic_pb2.ModelTrafficRequest(model_name="scaled", policy_json='{"weights": {"1": 5}}')
            )
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "traffic weights must add up to 100, they add up to 5" in refused.value.details()
        with pytest.raises(grpc.RpcError) as malformed:
            stub.ModelTraffic(traffic_pb2.ModelTrafficRequest(model_name="scaled", policy_json="{"))
        assert malformed.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        read = stub.ModelTraffic(traffic_pb2.ModelTrafficRequest(model_name="scaled"))
        assert json.loads(read.policy_json) == {"weights": {"1": 100.0}}


def test_the_command_line_reads_and_sets_the_policy(server: ServerProcess, client) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "coreserve", "traffic", "scaled", "--url", server.http_url, *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=60)

    done = run("--weights", "1=100")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"weights": {"1": 100.0}}
    assert _infer(client) == 1
    refused = run("--weights", "1=60,2=60")
    assert refused.returncode == 1
    assert "traffic weights must add up to 100, they add up to 120 (HTTP 400)" in refused.stderr
    cleared = run("--clear")
    assert cleared.returncode == 0 and json.loads(cleared.stdout) == {"weights": {}}
    for weights, words in (("1=0,1=100", "names version 1 twice"), ("1=nan,2=100", "VERSION=PERCENT")):
        refused = run("--weights", weights)
        assert refused.returncode == 2 and words in refused.stderr, refused.stderr
    assert _get(server) == {"weights": {}}
    odd = [sys.executable, "-m", "coreserve", "traffic", "my model?x=1", "--url", server.http_url]
    unknown = subprocess.run(odd, capture_output=True, text=True, timeout=60)
    assert unknown.returncode == 1 and "Traceback" not in unknown.stderr
    assert "my model?x=1" in unknown.stderr and "(HTTP 404)" in unknown.stderr, unknown.stderr


def test_a_policy_in_config_pbtxt_holds_from_the_start_and_a_bad_one_fails_the_load(
    coreserve_server: ServerFactory, tmp_path: Path
) -> None:
    good = SCALED + 'parameters { key: "coreserve_traffic_weights" value: { string_value: "1:100" } }\n'
    bad = SCALED + 'parameters { key: "coreserve_traffic_weights" value: { string_value: "1:50,3:50" } }\n'
    root = write_versions(tmp_path / "models", config=good)
    write_versions(root, "broken", config=bad)
    server = coreserve_server(root, "--exit-on-error=false")
    with httpclient.InferenceServerClient(server.http_url) as client:
        assert {_infer(client) for _ in range(10)} == {1}
        assert not client.is_model_ready("broken")
    index = json.loads(request(server.http_url, "POST", "/v2/repository/index", b"{}")[2])
    reason = next(entry["reason"] for entry in index if entry["name"] == "broken")
    assert "traffic policy of model 'broken' names version 3" in reason


def test_the_request_that_loads_a_model_on_demand_follows_its_policy(
    coreserve_server: ServerFactory, tmp_path: Path
) -> None:
    """Not the latest version (2): the load brings the policy, and the request that made it
    is routed by it, over HTTP and over gRPC."""
    config = SCALED + 'parameters { key: "coreserve_traffic_weights" value: { string_value: "1:100" } }\n'
    root = write_versions(tmp_path / "models", config=config)
    server = coreserve_server(root, "--model-control-mode=explicit", "--model-load-on-demand=true")
    with httpclient.InferenceServerClient(server.http_url) as client:
        assert not client.is_model_ready("scaled")
        assert _infer(client) == 1
        client.unload_model("scaled")
        wait_until(lambda: not client.is_model_ready("scaled"), "the model unloaded")
    with grpcclient.InferenceServerClient(server.grpc_url) as grpc_client:
        tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(ONES)
        result = grpc_client.infer("scaled", [tensor], parameters={"coreserve_traffic_key": "user-1"})
        assert _version_of(result.as_numpy("OUTPUT0")) == 1


def test_a_reload_that_drops_a_weighted_version_is_refused(
    coreserve_server: ServerFactory, repository: Path
) -> None:
    server = coreserve_server(repository, "--model-control-mode=explicit", "--load-model=scaled")
    assert _set(server, {"weights": {"1": 30, "2": 70}})[0] == 200
    (repository / "scaled" / "config.pbtxt").write_text(ONLY_VERSION_2)
    status, _, answer = request(server.http_url, "POST", "/v2/repository/models/scaled/load", b"{}")
    assert status == 400
    assert "version 1 takes requests under the model's traffic policy" in json.loads(answer)["error"]
    assert _get(server) == {"weights": {"1": 30.0, "2": 70.0}}
    # The load request may say where the weight goes, in the same step (JSON text, as gRPC sends it).
    moves = {"parameters": {"coreserve_traffic": json.dumps({"weights": {"1": 50, "2": 50}})}}
    status, _, answer = request(
        server.http_url, "POST", "/v2/repository/models/scaled/load", json.dumps(moves).encode()
    )
    assert status == 400 and "names version 1, which the model does not serve" in json.loads(answer)["error"]
    moves = {"parameters": {"coreserve_traffic": {"weights": {"2": 100}}}}
    status, _, answer = request(
        server.http_url, "POST", "/v2/repository/models/scaled/load", json.dumps(moves).encode()
    )
    assert status == 200, answer
    assert _get(server) == {"weights": {"2": 100.0}}
    assert _set(server, {"weights": {"2": 60, "1": 40}})[0] == 400  # version 1 is gone now
    (repository / "scaled" / "config.pbtxt").write_text(SCALED)
    assert request(server.http_url, "POST", "/v2/repository/models/scaled/load", b"{}")[0] == 200
    assert _get(server) == {"weights": {"2": 100.0}}  # a policy set at run time outlives the reload


def test_a_refused_reload_leaves_the_kept_versions_instances_as_they_were(
    coreserve_server: ServerFactory, repository: Path
) -> None:
    # The reload keeps version 2 (its files are unchanged) and asks for three instances of it
    # (ONNX Runtime's CPU default is two). Refused while the policy gives version 1 weight, it
    # changes no instance; once the load request moves that weight, the instance is added.
    server = coreserve_server(repository, "--model-control-mode=explicit", "--load-model=scaled")
    assert _set(server, {"weights": {"1": 30, "2": 70}})[0] == 200
    three_instances = ONLY_VERSION_2 + "instance_group [ { count: 3 kind: KIND_CPU } ]\n"
    (repository / "scaled" / "config.pbtxt").write_text(three_instances)
    load = "/v2/repository/models/scaled/load"
    status, _, answer = request(server.http_url, "POST", load, b"{}")
    assert status == 400 and "version 1 takes requests" in json.loads(answer)["error"]
    assert "in place" not in server.log
    moves = {"parameters": {"coreserve_traffic": {"weights": {"2": 100}}}}
    assert request(server.http_url, "POST", load, json.dumps(moves).encode())[0] == 200
    assert "model 'scaled' version 2: 1 instance(s) added and 0 retired in place" in server.log
    with httpclient.InferenceServerClient(server.http_url) as client:
        assert {_infer(client) for _ in range(4)} == {2}


@pytest.mark.parametrize(
    ("parameter", "text", "reason"),
    [
        # A lone surrogate, escaped in the parameter's JSON text (the parameter itself is UTF-8).
        ("coreserve_traffic", '{"weights": {"\\ud800": 100}}', "is not valid JSON"),
        ("coreserve_traffic", "[" * 3000 + "]" * 3000, "is not valid JSON"),
        ("config", '{"\\ud800": 1}', "not valid JSON: str is not valid UTF-8: surrogates not allowed"),
    ],
    ids=["surrogate", "deep", "surrogate-in-a-config"],
)
def test_a_load_parameter_that_cannot_be_read_is_refused_and_the_connection_serves_on(
    coreserve_server: ServerFactory, repository: Path, parameter: str, text: str, reason: str
) -> None:
    server = coreserve_server(repository, "--model-control-mode=explicit", "--load-model=scaled")
    body = json.dumps({"parameters": {parameter: text}}).encode()
    status, _, answer = request(server.http_url, "POST", "/v2/repository/models/scaled/load", body)
    assert status == 400 and reason in json.loads(answer)["error"], answer
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = grpc_service_pb2_grpc.GRPCInferenceServiceStub(channel)
        load = grpc_service_pb2.RepositoryModelLoadRequest(model_name="scaled")
        load.parameters[parameter].string_param = text
        with pytest.raises(grpc.RpcError) as info:
            stub.RepositoryModelLoad(load, timeout=30)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and reason in info.value.details()
        # The same connection serves the next call.
        assert stub.ModelReady(grpc_service_pb2.ModelReadyRequest(name="scaled"), timeout=30).ready
    assert _get(server) == {"weights": {}}
    assert "Traceback" not in server.log, server.log[-3000:]


def test_a_reload_may_drop_a_version_without_weight_and_the_policy_forgets_it(
    coreserve_server: ServerFactory, repository: Path
) -> None:
    server = coreserve_server(repository, "--model-control-mode=explicit", "--load-model=scaled")
    assert _set(server, {"weights": {"1": 0, "2": 100}})[0] == 200
    (repository / "scaled" / "config.pbtxt").write_text(ONLY_VERSION_2)
    assert request(server.http_url, "POST", "/v2/repository/models/scaled/load", b"{}")[0] == 200
    assert _get(server) == {"weights": {"2": 100.0}}
    metrics = _metrics(server)
    assert 'coreserve_traffic_weight{model="scaled",version="2"} 100' in metrics
    assert 'coreserve_traffic_weight{model="scaled",version="1"}' not in metrics


def test_oversized_policies_are_refused_and_the_server_keeps_serving(server: ServerProcess, client) -> None:
    crowd = "{" + ",".join(f'"{n}": 0' for n in range(1, 150_001)) + "}"
    status, answer = _set(server, f'{{"weights": {crowd}}}'.encode())
    assert status == 400 and "too many JSON values in the traffic policy" in answer["error"]
    # Thousands of versions the model does not serve: named in the error, cut short.
    unknown = {"1": 100} | {str(n): 0 for n in range(3, 20_000)}
    status, answer = _set(server, {"weights": unknown})
    assert status == 400 and "names version 3, 4, 5" in answer["error"] and len(answer["error"]) < 400
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = traffic_pb2_grpc.TrafficServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelTraffic(
                traffic_pb2.ModelTrafficRequest(model_name="scaled", policy_json=" " * 70_000 + "{}")
            )
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "at most 65536" in refused.value.details()
    assert _get(server) == {"weights": {}}
    assert _infer(client) == 2
    assert "Traceback" not in server.log
