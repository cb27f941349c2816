"""Shadow copies: a share of the requests also sent to a candidate version, compared output by
output with the client's answer, which they never change; a candidate that falls behind sheds
copies and counts them."""

from __future__ import annotations

import json
import re
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

import coreserve
from coreserve.testing import ServerFactory, ServerProcess
from support.waiting import wait_until
from support.wire.http_raw import request

from .conftest import SCALED, write_behaving, write_versions

ONES = np.ones((1, 4), np.float32)


def _metrics(server: ServerProcess) -> dict[str, float]:
    with urllib.request.urlopen(server.metrics_url, timeout=30) as answer:
        text = answer.read().decode()
    return {
        match[1]: float(match[2]) for match in re.finditer(r"^(coreserve_traffic_\S+) (\S+)$", text, re.M)
    }


def _policy(server: ServerProcess, model: str, policy: dict) -> None:
    status, _, answer = request(
        server.http_url, "POST", f"/v2/repository/models/{model}/traffic", json.dumps(policy).encode()
    )
    assert status == 200, answer


def _answer(client: httpclient.InferenceServerClient, model: str) -> float:
    tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(ONES)
    return float(client.infer(model, [tensor]).as_numpy("OUTPUT0")[0, 0])


def _labels(model: str, version: int, **more: str) -> str:
    return ",".join([f'model="{model}"', f'version="{version}"', *(f'{k}="{v}"' for k, v in more.items())])


def _copies(server: ServerProcess, model: str, version: int, count: int) -> dict[str, float]:
    """The copies sent to `version` of `model` by outcome, once `count` of them have one."""

    def outcomes() -> dict[str, float]:
        metrics = _metrics(server)
        return {
            outcome: metrics.get(
                "coreserve_traffic_shadow_requests_total{" + _labels(model, version, outcome=outcome) + "}", 0
            )
            for outcome in ("compared", "failed", "shed")
        }

    wait_until(lambda: sum(outcomes().values()) >= count, f"{count} copies to version {version} settled")
    return outcomes()


@pytest.fixture
def server(coreserve_server: ServerFactory, tmp_path: Path) -> ServerProcess:
    root = write_versions(tmp_path / "models", versions=(1, 2, 3))
    (root / "scaled" / "3" / "model.onnx").write_bytes((root / "scaled" / "1" / "model.onnx").read_bytes())
    write_behaving(root, "behaving", {1: "scale 1", 2: "fail", 3: "sleep 0.05"})
    return coreserve_server(root)


def test_the_candidate_answers_every_copy_and_none_reaches_the_client(server: ServerProcess) -> None:
    # None shed: a copy is sent once the client has its answer, so copies can outrun a candidate
    # whose first answers are slow, and 50 of them may be in flight at once.
    shadow = {"version": "2", "share": 100, "max_in_flight": 64}
    _policy(server, "scaled", {"weights": {"1": 100}, "shadow": shadow})
    with httpclient.InferenceServerClient(server.http_url) as client:
        assert {_answer(client, "scaled") for _ in range(50)} == {1.0}  # version 2 would say 2.0
    assert _copies(server, "scaled", 2, 50) == {"compared": 50, "failed": 0, "shed": 0}
    metrics = _metrics(server)
    output = "{" + _labels("scaled", 2, output="OUTPUT0") + "}"
    assert metrics["coreserve_traffic_shadow_output_comparisons_total" + output] == 50
    assert metrics["coreserve_traffic_shadow_output_mismatches_total" + output] == 50
    assert metrics["coreserve_traffic_shadow_output_max_abs_diff" + output] == 1.0  # 2 - 1
    statistics = json.loads(request(server.http_url, "GET", "/v2/models/scaled/stats")[2])
    counts = {entry["version"]: entry["inference_count"] for entry in statistics["model_stats"]}
    assert counts == {"1": 50, "2": 50, "3": 0}  # each version's own count, exactly


def test_requests_of_a_grpc_stream_and_of_the_generate_endpoint_are_copied(server: ServerProcess) -> None:
    """Their answers go through a sink of their own (DataPlane.submit and stream): a copy is
    taken there, and the client still gets version 1's answer alone."""
    shadow = {"version": "2", "share": 100, "max_in_flight": 64}  # none shed: the stream's 20 come at once
    _policy(server, "scaled", {"weights": {"1": 100}, "shadow": shadow})
    answers: list[object] = []
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(
            callback=lambda result, error: answers.append(error or result.as_numpy("OUTPUT0")[0, 0])
        )
        tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(ONES)
        for _ in range(20):
            client.async_stream_infer("scaled", [tensor])
        client.stop_stream()  # waits for every response
    body = json.dumps({"INPUT0": [1, 1, 1, 1]}).encode()
    for _ in range(10):
        status, _, answer = request(server.http_url, "POST", "/v2/models/scaled/generate", body)
        assert status == 200, answer
        answers.append(json.loads(answer)["OUTPUT0"][0])
    assert answers == [1.0] * 30
    assert _copies(server, "scaled", 2, 30) == {"compared": 30, "failed": 0, "shed": 0}
    mismatches = "coreserve_traffic_shadow_output_mismatches_total{" + _labels("scaled", 2, output="OUTPUT0")
    assert _metrics(server)[mismatches + "}"] == 30


DECOUPLED = """
backend: "python"
max_batch_size: 0
version_policy: { all { } }
model_transaction_policy { decoupled: true }
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1, 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1, 4 ] } ]
"""
# One answer a request, sent with the final flag: a copy could be compared, were it made.
DECOUPLED_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            request.get_response_sender().send(
                pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
        return None
"""


def test_a_decoupled_models_requests_are_not_copied(coreserve_server: ServerFactory, tmp_path: Path) -> None:
    """A decoupled model may answer many times, and its candidate as many or not: no copy."""
    folder = tmp_path / "models" / "streamer"
    for version in (1, 2):
        (folder / str(version)).mkdir(parents=True)
        (folder / str(version) / "model.py").write_text(DECOUPLED_MODEL)
    (folder / "config.pbtxt").write_text(DECOUPLED)
    server = coreserve_server(tmp_path / "models")
    _policy(server, "streamer", {"weights": {"1": 100}, "shadow": {"version": "2", "share": 100}})

    def stream(version: str, count: int) -> list[object]:
        answers: list[object] = []
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            client.start_stream(callback=lambda result, error: answers.append(error or result))
            tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
            tensor.set_data_from_numpy(ONES)
            for _ in range(count):
                client.async_stream_infer("streamer", [tensor], model_version=version)
            client.stop_stream()  # waits for every response
        assert len(answers) == count and all(isinstance(a, grpcclient.InferResult) for a in answers), answers
        return answers

    stream("", 10)
    # A copy would have queued in version 2 before this request: after its answer, none has run.
    stream("2", 1)

    def counts() -> dict[str, int]:
        statistics = json.loads(request(server.http_url, "GET", "/v2/models/streamer/stats")[2])
        return {
            entry["version"]: entry["inference_stats"]["success"]["count"]
            for entry in statistics["model_stats"]
        }

    # (A decoupled Python model's request is counted a turn of the loop after its last answer.)
    wait_until(lambda: counts().get("2", 0) >= 1, "version 2's request is counted")
    assert counts() == {"1": 10, "2": 1}
    assert not any(name.startswith("coreserve_traffic_shadow") for name in _metrics(server))


def test_a_candidate_that_answers_alike_shows_no_difference(server: ServerProcess) -> None:
    shadow = {"version": "3", "share": 100, "max_in_flight": 64}
    _policy(server, "scaled", {"weights": {"1": 100}, "shadow": shadow})
    with httpclient.InferenceServerClient(server.http_url) as client:
        for _ in range(20):
            _answer(client, "scaled")
    assert _copies(server, "scaled", 3, 20) == {"compared": 20, "failed": 0, "shed": 0}
    output = "{" + _labels("scaled", 3, output="OUTPUT0") + "}"
    metrics = _metrics(server)
    assert metrics["coreserve_traffic_shadow_output_comparisons_total" + output] == 20
    assert metrics["coreserve_traffic_shadow_output_mismatches_total" + output] == 0
    assert metrics["coreserve_traffic_shadow_output_max_abs_diff" + output] == 0


def test_a_failing_candidate_is_counted_and_the_client_never_sees_its_errors(server: ServerProcess) -> None:
    shadow = {"version": "2", "share": 100, "max_in_flight": 64}
    _policy(server, "behaving", {"weights": {"1": 100}, "shadow": shadow})
    with httpclient.InferenceServerClient(server.http_url) as client:
        assert {_answer(client, "behaving") for _ in range(10)} == {1.0}
    assert _copies(server, "behaving", 2, 10) == {"compared": 0, "failed": 10, "shed": 0}
    assert "Traceback" not in server.log


def test_a_candidate_that_falls_behind_sheds_copies_and_counts_them(server: ServerProcess) -> None:
    """Version 3 takes 50 ms a request on one instance; 200 requests, 16 at a time, outrun it."""
    shadow = {"version": "3", "share": 100, "max_in_flight": 4}
    _policy(server, "behaving", {"weights": {"1": 100}, "shadow": shadow})

    def one(_: int) -> float:
        with httpclient.InferenceServerClient(server.http_url) as client:
            return _answer(client, "behaving")

    with ThreadPoolExecutor(16) as pool:
        assert set(pool.map(one, range(200))) == {1.0}
    copies = _copies(server, "behaving", 3, 200)
    assert copies["shed"] > 0 and copies["compared"] > 0 and copies["failed"] == 0, copies
    assert sum(copies.values()) == 200, copies


def test_a_share_below_100_copies_about_that_share(server: ServerProcess) -> None:
    shadow = {"version": "2", "share": 25, "max_in_flight": 400}  # none shed
    _policy(server, "scaled", {"weights": {"1": 100}, "shadow": shadow})
    with httpclient.InferenceServerClient(server.http_url) as client:
        for _ in range(400):
            _answer(client, "scaled")
    # 100 expected; the binomial spread is about 9 (and a copy or two may still be in flight).
    copies = _copies(server, "scaled", 2, 50)
    assert 50 <= copies["compared"] <= 150 and copies["failed"] == copies["shed"] == 0, copies


def test_a_shadow_alone_leaves_the_clients_to_the_latest_version_but_the_shadows(
    server: ServerProcess,
) -> None:
    """Without weights the latest version answers, unless it is the shadow: the candidate never
    answers a client."""
    _policy(server, "scaled", {"shadow": {"version": "3", "max_in_flight": 64}})
    with httpclient.InferenceServerClient(server.http_url) as client:
        assert {_answer(client, "scaled") for _ in range(20)} == {2.0}  # version 3 is the latest
    assert _copies(server, "scaled", 3, 20) == {"compared": 20, "failed": 0, "shed": 0}


def test_an_in_process_caller_changing_its_answer_leaves_the_comparison_true(tmp_path: Path) -> None:
    """The in-process API hands the caller the answer's own arrays: the comparison is with a
    copy taken when the copy of the request is, not with what the caller makes of them."""
    config = SCALED + 'parameters { key: "coreserve_traffic_shadow" value: { string_value: "3:100:64" } }\n'
    config += 'parameters { key: "coreserve_traffic_weights" value: { string_value: "1:100" } }\n'
    root = write_versions(tmp_path / "models", config=config, versions=(1, 2, 3))
    (root / "scaled" / "3" / "model.onnx").write_bytes((root / "scaled" / "1" / "model.onnx").read_bytes())
    with coreserve.Server(root, exit_timeout_secs=10) as server:
        for _ in range(20):
            answer = server.model("scaled").infer({"INPUT0": ONES})
            assert answer.model_version == "1"
            answer.outputs["OUTPUT0"] *= 10  # as a caller scaling its answer in place would

        def comparisons() -> dict[str, float]:
            text = server.metrics()
            return {
                match[1]: float(match[2])
                for match in re.finditer(
                    r'^coreserve_traffic_shadow_output_(\w+)\{.*version="3".*\} (\S+)$', text, re.M
                )
            }

        wait_until(lambda: comparisons().get("comparisons_total") == 20, "20 outputs compared")
        assert comparisons() == {"comparisons_total": 20, "mismatches_total": 0, "max_abs_diff": 0}


def test_a_models_shadow_series_leave_the_metrics_when_it_unloads(
    coreserve_server: ServerFactory, tmp_path: Path
) -> None:
    """As Triton's per-model series do (and as the repository index drops its rollout)."""
    root = write_versions(tmp_path / "models", versions=(1, 2))
    write_versions(root, "other", versions=(1, 2))
    server = coreserve_server(root, "--model-control-mode=explicit", "--load-model=*")
    for model in ("scaled", "other"):
        _policy(server, model, {"weights": {"1": 100}, "shadow": {"version": "2", "max_in_flight": 64}})
    with httpclient.InferenceServerClient(server.http_url) as client:
        for model in ("scaled", "other"):
            _answer(client, model)
        _copies(server, "scaled", 2, 1)
        _copies(server, "other", 2, 1)
        client.unload_model("scaled")
    metrics = _metrics(server)
    assert not [name for name in metrics if 'model="scaled"' in name]
    other = "{" + _labels("other", 2, outcome="compared") + "}"
    assert metrics["coreserve_traffic_shadow_requests_total" + other] == 1
