"""The policy holds in every mode: in each worker of a server of several (sticky keys land on
the same version in every worker, the metrics merge), and for the requests that ensembles, BLS
calls and the OpenAI frontend make."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import openai
import tritonclient.http as httpclient

from coreserve.testing import ServerFactory
from support.model_builders import ADD_SUB_CONFIG, add_sub_model, write_model
from support.servers.openai_repository import openai_repository, openai_url
from support.servers.worker_servers import (
    CONNECTIONS,
    answer_of,
    start_workers,
    status_of,
    urlopen_text,
    worker_index,
    worker_pids,
)
from support.waiting import wait_until
from support.wire.http_raw import request

from .conftest import INFER_BODY

PIPELINE = """
platform: "ensemble"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [ { model_name: "scaled" model_version: -1
  input_map { key: "INPUT0" value: "X" } output_map { key: "OUTPUT0" value: "Y" } } ] }
"""


def _served(answer: bytes) -> int:
    return int(json.loads(answer)["outputs"][0]["data"][0])


def test_every_worker_applies_the_policy_and_keys_stick_across_workers(repository: Path) -> None:
    write_model(repository, "add_sub", add_sub_model(), ADD_SUB_CONFIG)  # what start_workers loads
    server = start_workers(repository, "--load-model=scaled")
    try:
        status, answer = answer_of(
            server,
            "POST",
            "/v2/repository/models/scaled/traffic",
            json.dumps({"weights": {"1": 50, "2": 50}}),
        )
        assert status == 200, answer
        for key in ("alice", "bob", "carol", "dave"):
            body = json.dumps({**json.loads(INFER_BODY), "parameters": {"coreserve_traffic_key": key}})
            # Each request on a connection of its own: over 40 of them, both workers answer.
            versions = {
                _served(answer_of(server, "POST", "/v2/models/scaled/infer", body)[1])
                for _ in range(CONNECTIONS)
            }
            assert len(versions) == 1, (key, versions)
        served = {
            _served(answer_of(server, "POST", "/v2/models/scaled/infer", INFER_BODY)[1])
            for _ in range(CONNECTIONS)
        }
        assert served == {1, 2}
        metrics = urlopen_text(server.metrics_url)
        assert 'coreserve_traffic_weight{model="scaled",version="1"} 50' in metrics  # once, not summed
    finally:
        server.close()


def test_a_worker_started_again_applies_the_policy_set_before(repository: Path) -> None:
    write_model(repository, "add_sub", add_sub_model(), ADD_SUB_CONFIG)  # what start_workers loads
    server = start_workers(repository, "--load-model=scaled")
    try:
        policy = json.dumps({"weights": {"1": 100}})
        assert answer_of(server, "POST", "/v2/repository/models/scaled/traffic", policy)[0] == 200
        for index in (0, 1):
            dead = next(pid for pid in worker_pids(server) if worker_index(pid) == index)
            os.kill(dead, signal.SIGKILL)
            wait_until(
                lambda dead=dead: dead not in worker_pids(server) and len(worker_pids(server)) == 2,  # type: ignore[misc]
                "started again",
            )
            wait_until(lambda: status_of(server, "GET", "/v2/health/ready") == 200, "ready", timeout=120)
            served = {
                _served(answer_of(server, "POST", "/v2/models/scaled/infer", INFER_BODY)[1])
                for _ in range(CONNECTIONS)
            }
            assert served == {1}, index
        assert "Traceback" not in server.log
    finally:
        server.close()


def test_an_ensemble_step_that_names_no_version_follows_the_policy(
    coreserve_server: ServerFactory, repository: Path
) -> None:
    (repository / "pipeline" / "1").mkdir(parents=True)
    (repository / "pipeline" / "config.pbtxt").write_text(PIPELINE)
    server = coreserve_server(repository)
    with httpclient.InferenceServerClient(server.http_url) as client:
        tensor = httpclient.InferInput("X", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        assert client.infer("pipeline", [tensor]).as_numpy("Y")[0, 0] == 2  # the latest version
        body = json.dumps({"weights": {"1": 100}}).encode()
        assert request(server.http_url, "POST", "/v2/repository/models/scaled/traffic", body)[0] == 200
        assert {float(client.infer("pipeline", [tensor]).as_numpy("Y")[0, 0]) for _ in range(10)} == {1.0}


def test_an_ensemble_step_lands_where_the_clients_traffic_key_says(
    coreserve_server: ServerFactory, repository: Path
) -> None:
    """The header's key travels to the steps: each key lands on the version it lands on when
    sent to the model itself, and it wins over a parameter that says another key."""
    (repository / "pipeline" / "1").mkdir(parents=True)
    (repository / "pipeline" / "config.pbtxt").write_text(PIPELINE)
    server = coreserve_server(repository)
    body = json.dumps({"weights": {"1": 50, "2": 50}}).encode()
    assert request(server.http_url, "POST", "/v2/repository/models/scaled/traffic", body)[0] == 200

    def served(model: str, key: str, parameter: str | None = None) -> int:
        tensor = httpclient.InferInput("X" if model == "pipeline" else "INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        parameters = {"coreserve_traffic_key": parameter} if parameter is not None else None
        answer = client.infer(model, [tensor], headers={"coreserve-traffic-key": key}, parameters=parameters)
        return int(answer.as_numpy("Y" if model == "pipeline" else "OUTPUT0")[0, 0])

    with httpclient.InferenceServerClient(server.http_url) as client:
        direct = {f"user-{n}": served("scaled", f"user-{n}") for n in range(16)}
        assert set(direct.values()) == {1, 2}
        for key, version in direct.items():
            assert {served("pipeline", key) for _ in range(3)} == {version}, key
        other = {version: key for key, version in direct.items()}
        for key, version in direct.items():
            assert served("pipeline", key, parameter=other[3 - version]) == version, key


BLS_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
BLS_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            call = pb_utils.InferenceRequest(
                model_name="scaled", requested_output_names=["OUTPUT0"], inputs=[pb_utils.Tensor("INPUT0", x.as_numpy())]
            )
            answer = call.exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            output = pb_utils.get_output_tensor_by_name(answer, "OUTPUT0")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", output.as_numpy())]))
        return responses
"""


def test_a_bls_call_that_names_no_version_follows_the_policy(
    coreserve_server: ServerFactory, repository: Path
) -> None:
    (repository / "caller" / "1").mkdir(parents=True)
    (repository / "caller" / "config.pbtxt").write_text(BLS_CONFIG)
    (repository / "caller" / "1" / "model.py").write_text(BLS_MODEL)
    server = coreserve_server(repository)
    body = json.dumps({"weights": {"1": 100}}).encode()
    assert request(server.http_url, "POST", "/v2/repository/models/scaled/traffic", body)[0] == 200
    with httpclient.InferenceServerClient(server.http_url) as client:
        tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        assert {float(client.infer("caller", [tensor]).as_numpy("OUTPUT0")[0, 0]) for _ in range(10)} == {1.0}


def _charlm_twice(root: Path) -> Path:
    """The OpenAI test models, charlm served as versions 1 and 2 (the same model)."""
    openai_repository(root)
    shutil.copytree(root / "charlm" / "1", root / "charlm" / "2")
    with (root / "charlm" / "config.pbtxt").open("a") as config:
        config.write("version_policy: { all { } }\n")
    return root


def test_the_openai_frontend_follows_the_policy(coreserve_server: ServerFactory, tmp_path: Path) -> None:
    """With every request to version 1 (not the latest, which serves without a policy),
    completions and streamed chats count there alone."""
    server = coreserve_server(_charlm_twice(tmp_path / "models"), "--openai-port=0")
    body = json.dumps({"weights": {"1": 100}}).encode()
    assert request(server.http_url, "POST", "/v2/repository/models/charlm/traffic", body)[0] == 200
    with openai.OpenAI(base_url=openai_url(server), api_key="unused", max_retries=0, timeout=60) as client:
        for _ in range(3):
            assert (
                client.completions.create(model="charlm", prompt="The server", max_tokens=4).choices[0].text
            )
        chat = client.chat.completions.create(
            model="charlm", messages=[{"role": "user", "content": "Hello"}], max_tokens=4, stream=True
        )
        assert "".join(chunk.choices[0].delta.content or "" for chunk in chat if chunk.choices)

    def requests_of(version: int) -> int:
        path = f"/v2/models/charlm/versions/{version}/stats"
        statistics = json.loads(request(server.http_url, "GET", path)[2])
        return int(statistics["model_stats"][0]["inference_stats"]["success"]["count"])

    assert (requests_of(1), requests_of(2)) == (4, 0)
    # Under 50/50, the header's traffic key keeps one client's requests on one version.
    body = json.dumps({"weights": {"1": 50, "2": 50}}).encode()
    assert request(server.http_url, "POST", "/v2/repository/models/charlm/traffic", body)[0] == 200
    with openai.OpenAI(base_url=openai_url(server), api_key="unused", max_retries=0, timeout=60) as client:
        for _ in range(8):
            client.completions.create(
                model="charlm", prompt="The", max_tokens=2, extra_headers={"coreserve-traffic-key": "alice"}
            )
    assert (requests_of(1), requests_of(2)) in ((12, 0), (4, 8))


def test_a_rollout_judges_the_openai_frontends_requests(
    coreserve_server: ServerFactory, tmp_path: Path
) -> None:
    """A rollout of charlm's version 2 needs its candidate to answer requests before it goes on:
    streamed completions alone get it promoted."""
    server = coreserve_server(_charlm_twice(tmp_path / "models"), "--openai-port=0")
    body = json.dumps({"weights": {"1": 100}}).encode()
    assert request(server.http_url, "POST", "/v2/repository/models/charlm/traffic", body)[0] == 200
    plan = {"candidate": "2", "steps": [50, 100], "dwell_s": 0.5, "min_requests": 3, "max_p99_ratio": 1000}
    status, _, answer = request(
        server.http_url, "POST", "/v2/repository/models/charlm/rollout", json.dumps(plan).encode()
    )
    assert status == 200, answer

    def state() -> str:
        return str(
            json.loads(request(server.http_url, "GET", "/v2/repository/models/charlm/rollout")[2])["state"]
        )

    with openai.OpenAI(base_url=openai_url(server), api_key="unused", max_retries=0, timeout=60) as client:
        deadline = time.monotonic() + 60
        while state() == "RUNNING" and time.monotonic() < deadline:
            stream = client.completions.create(model="charlm", prompt="The", max_tokens=2, stream=True)
            assert "".join(chunk.choices[0].text for chunk in stream)
    rollout = json.loads(request(server.http_url, "GET", "/v2/repository/models/charlm/rollout")[2])
    assert rollout["state"] == "PROMOTED", rollout
    assert rollout["window"]["candidate"]["requests"] >= 3
