"""Loading models on demand (`--model-load-on-demand`) in explicit mode, over HTTP and gRPC, with
real servers and tritonclient: one shared load per model, failures, unknown models, BLS calls,
and the flag off (Triton's behaviour)."""

from __future__ import annotations

import json
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerFactory, ServerProcess
from support.model_builders import scale_model, write_bls_model, write_model
from support.waiting import requests_in, wait_until

SCALE = """
backend: "onnxruntime"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
PIPELINE = """
platform: "ensemble"
max_batch_size: 4
input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [ { model_name: "tripled" model_version: -1
  input_map { key: "INPUT0" value: "A" } output_map { key: "OUTPUT0" value: "B" } } ] }
"""
SLOW = """
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(3)

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests
        ]
"""
SLOW_CONFIG = SCALE.replace('backend: "onnxruntime"', 'backend: "python"')
STOPPING = "Server is stopping, scheduler for model has stopped accepting new inference requests"
# A model whose configuration names an input its ONNX file does not have: it fails to load.
BROKEN = SCALE.replace('"INPUT0"', '"NOT_AN_INPUT"')


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    write_model(root, "doubled", scale_model(2.0), SCALE)
    write_model(root, "tripled", scale_model(3.0), SCALE)
    write_model(root, "scale", scale_model(5.0), SCALE)
    write_model(root, "broken", scale_model(2.0), BROKEN)
    write_bls_model(root, "bls")
    (root / "pipeline" / "1").mkdir(parents=True)
    (root / "pipeline" / "config.pbtxt").write_text(PIPELINE)
    write_model(root, "slow", None, SLOW_CONFIG)
    (root / "slow" / "1" / "model.py").write_text(SLOW)
    return root


@pytest.fixture
def server(coreserve_server: ServerFactory, repository: Path) -> ServerProcess:
    return coreserve_server(
        repository, "--model-control-mode=explicit", "--model-load-on-demand", "--exit-on-error=false"
    )


def _http_infer(url: str, model: str) -> np.ndarray:
    client = httpclient.InferenceServerClient(url, network_timeout=120)
    try:
        tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        return client.infer(model, [tensor]).as_numpy("OUTPUT0" if model != "bls" else "OUT")
    finally:
        client.close()


def _grpc_infer(url: str, model: str) -> np.ndarray:
    client = grpcclient.InferenceServerClient(url)
    try:
        tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        return client.infer(model, [tensor], client_timeout=120).as_numpy("OUTPUT0")
    finally:
        client.close()


def _metrics(server: ServerProcess) -> str:
    with urllib.request.urlopen(server.metrics_url, timeout=30) as answer:
        return answer.read().decode()


def _sample(text: str, name: str, labels: str = "") -> float:
    match = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, flags=re.M)
    assert match is not None, f"{name}{labels} not in the metrics"
    return float(match[1])


def _index(server: ServerProcess) -> dict[str, dict[str, str]]:
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/repository/index", data=b"{}", method="POST"
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return {entry["name"]: entry for entry in json.load(answer)}


def test_a_request_over_http_loads_the_model_and_is_answered(server: ServerProcess) -> None:
    assert _index(server)["doubled"] == {"name": "doubled"}  # never loaded
    assert _http_infer(server.http_url, "doubled").tolist() == [[2.0] * 4]
    entry = _index(server)["doubled"]
    assert entry["state"] == "READY"
    assert int(entry["memory_bytes"]) >= 0 and entry["last_used"].endswith("+00:00")
    metrics = _metrics(server)
    assert _sample(metrics, "coreserve_model_loads_total", '{reason="demand"}') == 1
    assert _sample(metrics, "coreserve_model_load_wait_seconds_count") == 1
    assert _sample(metrics, "coreserve_model_memory_bytes", '{model="doubled"}') == int(entry["memory_bytes"])


def test_a_request_over_grpc_loads_the_model_and_is_answered(server: ServerProcess) -> None:
    assert _grpc_infer(server.grpc_url, "tripled").tolist() == [[3.0] * 4]
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        assert client.is_model_ready("tripled")
        # gRPC's index keeps to Triton's fields.
        index = client.get_model_repository_index(as_json=True)["models"]
        assert {"name": "tripled", "version": "1", "state": "READY"} in index
    finally:
        client.close()


def test_a_streams_requests_load_their_models_in_order(server: ServerProcess) -> None:
    answers: queue.Queue[object] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(lambda result, error: answers.put(error or result))
        tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        for number, model in enumerate(["doubled", "scale", "nowhere", "doubled"]):
            client.async_stream_infer(model, [tensor], request_id=str(number))
        got = [answers.get(timeout=120) for _ in range(4)]
        client.stop_stream()
    finally:
        client.close()
    # Each request's model loads before the stream's next request is taken, so the loads run in
    # the requests' order; answers of different models may overtake each other (one that fails
    # at once, one of a model loaded already), as on Triton.
    errors = [answer for answer in got if isinstance(answer, InferenceServerException)]
    answers_by_id = {answer.get_response().id: answer for answer in got if answer not in errors}  # type: ignore[union-attr]
    assert {key: answer.as_numpy("OUTPUT0").tolist() for key, answer in answers_by_id.items()} == {  # type: ignore[union-attr]
        "0": [[2.0] * 4], "1": [[5.0] * 4], "3": [[2.0] * 4]
    }  # fmt: skip
    assert len(errors) == 1 and "Request for unknown model: 'nowhere' is not found" in str(errors[0])
    loads = re.findall(r"loading model '(\w+)' on demand", server.log)
    assert loads == ["doubled", "scale", "nowhere"]


def test_concurrent_first_requests_share_one_load(server: ServerProcess) -> None:
    results: list[object] = []

    def call(index: int) -> None:
        try:
            if index % 2:
                results.append(_grpc_infer(server.grpc_url, "doubled").tolist())
            else:
                results.append(_http_infer(server.http_url, "doubled").tolist())
        except Exception as exc:  # reported by the assertion below
            results.append(exc)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert results == [[[2.0] * 4]] * 8
    assert server.log.count("loading model 'doubled' on demand") == 1
    metrics = _metrics(server)
    assert _sample(metrics, "coreserve_model_loads_total", '{reason="demand"}') == 1
    assert _sample(metrics, "coreserve_model_load_wait_seconds_count") >= 1


def test_a_model_that_fails_to_load_answers_with_its_reason_and_the_server_keeps_serving(
    server: ServerProcess,
) -> None:
    for call in (_http_infer, _grpc_infer):
        url = server.http_url if call is _http_infer else server.grpc_url
        with pytest.raises(InferenceServerException) as failed:
            call(url, "broken")
        assert "Request for unknown model: 'broken' has no available versions" in str(failed.value)
        assert "NOT_AN_INPUT" in str(failed.value)
    assert server.log.count("loading model 'broken' on demand") == 1  # not tried again at once
    assert _http_infer(server.http_url, "doubled").tolist() == [[2.0] * 4]


def test_a_model_that_failed_is_loaded_on_demand_again_after_a_back_off(
    server: ServerProcess, repository: Path
) -> None:
    # The back-off's length, and its doubling, are tested on a clock of the test's (see
    # tests/core/repository/memory/test_demand_back_off.py); here the order of events: a
    # request right after the failure gets its reason without a new try, and a later one loads
    # the mended model, with one try more.
    with pytest.raises(InferenceServerException, match="NOT_AN_INPUT"):
        _http_infer(server.http_url, "broken")
    (repository / "broken" / "config.pbtxt").write_text(SCALE)  # mended
    with pytest.raises(InferenceServerException, match="NOT_AN_INPUT"):  # within the back-off
        _http_infer(server.http_url, "broken")
    assert server.log.count("loading model 'broken' on demand") == 1  # not tried again at once

    def answered() -> bool:
        try:
            return bool(_http_infer(server.http_url, "broken").tolist() == [[2.0] * 4])
        except InferenceServerException:
            return False

    wait_until(answered, "the mended model loaded on demand", timeout=30, interval=0.5)
    assert server.log.count("loading model 'broken' on demand") == 2


def test_an_unknown_model_is_still_not_found(server: ServerProcess) -> None:
    with pytest.raises(InferenceServerException) as http_failure:
        _http_infer(server.http_url, "nowhere")
    assert http_failure.value.status() == "404"
    assert "Request for unknown model: 'nowhere' is not found" in str(http_failure.value)
    with pytest.raises(InferenceServerException) as grpc_failure:
        _grpc_infer(server.grpc_url, "nowhere")
    assert grpc_failure.value.status() == "StatusCode.NOT_FOUND"
    for _ in range(20):  # a client asking on: the repository is not looked through each time
        with pytest.raises(InferenceServerException, match="'nowhere' is not found"):
            _http_infer(server.http_url, "nowhere")
    assert server.log.count("loading model 'nowhere' on demand") < 20


def test_a_bls_call_loads_the_model_it_calls(server: ServerProcess) -> None:
    assert _http_infer(server.http_url, "bls").tolist() == [[25.0] * 4]  # scale(scale(1)), loaded on demand
    assert _sample(_metrics(server), "coreserve_model_loads_total", '{reason="demand"}') == 2


def test_an_ensemble_loads_with_its_steps(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    try:
        tensor = httpclient.InferInput("A", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        assert client.infer("pipeline", [tensor]).as_numpy("B").tolist() == [[3.0] * 4]
    finally:
        client.close()
    assert _index(server)["tripled"]["state"] == "READY"


def test_a_request_waits_no_longer_than_its_timeout_and_the_load_goes_on(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    try:
        tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        with pytest.raises(InferenceServerException) as failure:
            client.infer("slow", [tensor], timeout=200_000)  # µs: the model takes 3 s to load
        assert failure.value.status() == "503"
        assert "Request timeout expired: model 'slow' was still loading on demand after 0.2 s" in str(
            failure.value
        )
        assert client.infer("slow", [tensor]).as_numpy("OUTPUT0").tolist() == [[1.0] * 4]
    finally:
        client.close()
    assert server.log.count("loading model 'slow' on demand") == 1


def test_without_the_flag_a_request_for_a_model_not_loaded_fails_as_in_triton(
    coreserve_server: ServerFactory, repository: Path
) -> None:
    server = coreserve_server(repository, "--model-control-mode=explicit", "--load-model=doubled")
    with pytest.raises(InferenceServerException) as failure:
        _http_infer(server.http_url, "tripled")
    assert failure.value.status() == "404"
    assert "Request for unknown model: 'tripled' is not found" in str(failure.value)
    assert _index(server)["tripled"] == {"name": "tripled"}  # as Triton lists a model never loaded
    assert "coreserve_model_loads_total" not in _metrics(server)


# A request runs until the test creates the file `release` in the model's folder (at most
# 60 s): the server drains it when told to stop.
LINGERING = """
import time
from pathlib import Path

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.release = Path(args["model_repository"]) / "release"

    def execute(self, requests):
        deadline = time.monotonic() + 60
        while not self.release.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests
        ]
"""


def test_no_model_is_loaded_on_demand_once_the_stop_began(
    coreserve_server: ServerFactory, repository: Path
) -> None:
    """The stop unloads every model: a request for one not loaded is refused (503, Triton's
    stopping words) while the requests taken finish. It used to load the model, during the
    stop, and run the request."""
    write_model(repository, "lingering", None, SLOW_CONFIG)
    (repository / "lingering" / "1" / "model.py").write_text(LINGERING)
    server = coreserve_server(
        repository, "--model-control-mode=explicit", "--model-load-on-demand", "--load-model=lingering"
    )
    assert server.process is not None
    # (The stop closes the listening sockets: the requests travel on a stream opened before.)
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for model in ("lingering", "doubled"):
            tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
            client.async_stream_infer(model, [tensor])
            if model == "lingering":
                wait_until(lambda: requests_in(server.metrics_url, "lingering") == 1, "it runs")
                server.process.send_signal(signal.SIGTERM)
                wait_until(lambda: "signal received; stopping" in server.log, "the stop began", 10)
        # The stream answers in order: the refusal comes after the request taken. That one is
        # let go once the other request had a second to reach the server.
        time.sleep(1)
        (repository / "lingering" / "release").touch()
        (taken, none), (nothing, refused) = sorted(
            (answers.get(timeout=30) for _ in range(2)), key=lambda a: a[0] is None
        )
    finally:
        client.stop_stream()
        client.close()
    assert none is None and taken.as_numpy("OUTPUT0").tolist() == [[1, 1, 1, 1]]
    assert nothing is None and refused.message() == STOPPING  # (a stream's error has no status)
    assert server.wait(timeout=30) == 0
    assert "'doubled'" not in server.log  # (never loaded)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--model-control-mode=explicit", "--model-memory-budget=0"], "must be above 0 bytes, got '0'"),
        (["--model-control-mode=explicit", "--model-memory-budget=abc"], "got 'abc'"),
        (["--model-control-mode=explicit", "--model-memory-budget=150%"], "at most 100, got '150%'"),
        (["--model-memory-budget=1GB"], "--model-memory-budget needs --model-control-mode=explicit"),
        (["--model-load-on-demand"], "--model-load-on-demand needs --model-control-mode=explicit"),
        (
            ["--model-control-mode=explicit", "--model-memory-budget=1GB", "--model-memory-budget=2GB"],
            "the host's model memory budget is given twice",
        ),
        (["--model-control-mode=explicit", "--model-memory-budget=gpu:a=1GB"], "as gpu:<id>=BYTES"),
        (
            ["--model-control-mode=explicit", "--model-memory-budget=gpu:0=101%"],
            "at most 100, got 'gpu:0=101%'",
        ),
        (
            [
                "--model-control-mode=explicit",
                "--model-memory-budget=gpu:0=1GB",
                "--model-memory-budget=gpu:0=1GB",
            ],
            "the model memory budget of GPU 0 is given twice",
        ),
    ],
)
def test_bad_settings_are_refused_at_startup(tmp_path: Path, flags: list[str], message: str) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "coreserve", f"--model-repository={tmp_path}", *flags],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert message in run.stderr


@pytest.mark.parametrize("budget", ["gpu:0=1GB", "gpu:0=50%"])
def test_a_gpu_budget_without_nvml_stops_the_start_with_the_reason(tmp_path: Path, budget: str) -> None:
    try:  # where NVML reads a GPU, the budget is kept (test_model_memory_budget.py)
        import pynvml

        pynvml.nvmlInit()
        pytest.skip("NVML works here: the budget starts (its test is test_model_memory_budget.py)")
    except ImportError:
        reason = "pip install nvidia-ml-py"
    except Exception:  # NVMLError: installed, but no driver or GPU
        reason = "needs NVML, which is not usable here"
    run = subprocess.run(
        [sys.executable, "-m", "coreserve", f"--model-repository={tmp_path}", "--model-control-mode=explicit",
         f"--model-memory-budget={budget}", "--http-port=0", "--grpc-port=0", "--metrics-port=0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 1
    assert "--model-memory-budget: a GPU model memory budget (gpu:0)" in run.stderr and reason in run.stderr
    assert "Traceback" not in run.stderr
