"""Serving more models than fit in memory (`--model-memory-budget` with `--model-load-on-demand`):
real servers, Python models that hold 30 MiB each, a client that cycles through them."""

from __future__ import annotations

import json
import re
import shutil
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.repository.memory.budgets import process_tree_rss
from coreserve.testing import ServerFactory, ServerProcess
from support.gpu_checks import gpu_0_unusable

MODELS = 20
HOLDING = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.block = np.ones(30 * 2**20 // 8)  # 30 MiB, written (so resident)
        self.factor = float(args["model_name"].split("_")[1])

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() * self.factor)]
            )
            for r in requests
        ]
"""
CONFIG = """
backend: "python"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
PINNED = '\nparameters { key: "coreserve_pinned" value { string_value: "true" } }\n'


def _name(number: int) -> str:
    return f"model_{number:02d}"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("budget") / "models"
    for number in range(MODELS):
        folder = root / _name(number)
        (folder / "1").mkdir(parents=True)
        (folder / "1" / "model.py").write_text(HOLDING)
        (folder / "config.pbtxt").write_text(CONFIG + (PINNED if number == 1 else ""))
    return root


def _infer(client: httpclient.InferenceServerClient, model: str) -> np.ndarray:
    tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    return client.infer(model, [tensor]).as_numpy("OUTPUT0")


def _index(server: ServerProcess) -> dict[str, dict[str, str]]:
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/repository/index", data=b"{}", method="POST"
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return {entry["name"]: entry for entry in json.load(answer)}


def _sample(server: ServerProcess, name: str) -> float:
    with urllib.request.urlopen(server.metrics_url, timeout=30) as answer:
        text = answer.read().decode()
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, flags=re.M)
    assert match is not None, f"{name} not in the metrics"
    return float(match[1])


@pytest.fixture(scope="module")
def model_size(repository: Path) -> int:
    """One model's measured memory (its stub process and its 30 MiB), from a server without a budget."""
    server = ServerProcess([repository], ["--model-control-mode=explicit", "--model-load-on-demand"]).start()
    try:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
        _infer(client, _name(5))
        client.close()
        size = int(_index(server)[_name(5)]["memory_bytes"])
    finally:
        server.close()
    assert size >= 30 * 2**20, size  # the block it holds, at least
    return size


def test_twenty_models_cycle_through_a_budget_that_holds_five(
    coreserve_server: ServerFactory, repository: Path, model_size: int
) -> None:
    budget = int(5.5 * model_size)
    server = coreserve_server(
        repository,
        "--model-control-mode=explicit",
        "--model-load-on-demand",
        f"--model-memory-budget={budget}",
        f"--load-model={_name(0)}",  # pinned, as model_01 is by its configuration
    )
    assert server.process is not None
    baseline = process_tree_rss(server.process.pid) - model_size  # the server with no model loaded
    # The stated margin: one model (a model never measured loads first, and makes room after).
    margin = model_size
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    try:
        # The last two are still loaded: the two pinned and the last two take 4 of the 5.5 sizes, a
        # slack of one and a half for sizes measured apart from model_size.
        order = [*range(MODELS), MODELS - 1, MODELS - 2]
        for number in order:
            assert _infer(client, _name(number)).tolist() == [[float(number)] * 4], number
            rss = process_tree_rss(server.process.pid)
            assert rss <= baseline + budget + margin, (number, rss, baseline, budget)
    finally:
        client.close()
    index = _index(server)
    ready = [name for name, entry in index.items() if entry.get("state") == "READY"]
    assert _name(0) in ready and _name(1) in ready  # pinned: never unloaded
    assert {_name(MODELS - 1), _name(MODELS - 2)} <= set(ready)
    assert sum(int(index[name]["memory_bytes"]) for name in ready) <= budget
    loads = _sample(server, 'coreserve_model_loads_total{reason="demand"}')
    assert loads == MODELS - 1  # each once (model_00 loaded at start-up); the revisits loaded nothing
    evictions = _sample(server, "coreserve_model_evictions_total")
    assert evictions == loads + 1 - len(ready)
    assert evictions >= MODELS - 6


def test_a_load_with_no_room_fails_naming_the_budget(
    coreserve_server: ServerFactory, repository: Path, model_size: int
) -> None:
    budget = int(1.5 * model_size)
    server = coreserve_server(
        repository,
        "--model-control-mode=explicit",
        "--model-load-on-demand",
        f"--model-memory-budget={budget}",
        f"--load-model={_name(0)}",
    )
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    try:
        with pytest.raises(InferenceServerException) as failure:
            _infer(client, _name(2))
        message = str(failure.value)
        assert failure.value.status() == "503"
        assert f"cannot load model '{_name(2)}' (measured now) within the model memory budget of" in message
        assert "no other loaded model can be unloaded to make room" in message
        # Its size is known now: the next request is refused before it loads.
        with pytest.raises(InferenceServerException) as again:
            _infer(client, _name(2))
        assert "at its last load" in str(again.value)
        assert _infer(client, _name(0)).tolist() == [[0.0] * 4]  # the server keeps serving
    finally:
        client.close()
    assert _index(server)[_name(2)] == {"name": _name(2)}  # it never served


def test_without_loads_on_demand_a_model_a_serving_ensemble_uses_is_not_unloaded_to_make_room(
    coreserve_server: ServerFactory, repository: Path, model_size: int, tmp_path: Path
) -> None:
    """Nothing would load it again: the ensemble would say READY and fail every request."""
    root = tmp_path / "models"
    for number in (2, 3, 4):
        shutil.copytree(repository / _name(number), root / _name(number))
    (root / "twice" / "1").mkdir(parents=True)
    (root / "twice" / "config.pbtxt").write_text(
        CONFIG.replace('backend: "python"', 'platform: "ensemble"')
        + 'ensemble_scheduling { step [ { model_name: "model_02" model_version: -1 '
        'input_map { key: "INPUT0" value: "INPUT0" } output_map { key: "OUTPUT0" value: "OUTPUT0" } } ] }'
    )
    budget = int(2.5 * model_size)
    server = coreserve_server(root, "--model-control-mode=explicit", f"--model-memory-budget={budget}")
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    try:
        client.load_model("twice")  # model_02 first, the least recently used from now on
        client.load_model(_name(3))
        client.load_model(_name(4))  # makes room: model_03 goes, model_02 stays
        assert _infer(client, "twice").tolist() == [[2.0] * 4]
    finally:
        client.close()
    index = _index(server)
    assert [index[_name(number)]["state"] for number in (2, 3, 4)] == ["READY", "UNAVAILABLE", "READY"]


ON_GPU = """
import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.block = torch.ones(2 * 2**30, dtype=torch.uint8, device="cuda:0")  # 2 GiB on GPU 0

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests
        ]
"""


GPU_UNUSABLE = gpu_0_unusable()


@pytest.mark.skipif(bool(GPU_UNUSABLE), reason=GPU_UNUSABLE or "GPU 0 is usable")
def test_a_gpu_budget_unloads_the_least_recently_used_model_on_that_gpu(tmp_path: Path) -> None:
    """Three models of 2 GiB (and a CUDA context each, in its stub) on GPU 0, a budget of 7 GB
    there: two fit (where a context takes 0.2 to 1.3 GB); loading the third unloads the one used
    least recently. Runs on a GPU machine (.ci/gpu-tests)."""
    root = tmp_path / "models"
    for name in ("gpu_a", "gpu_b", "gpu_c"):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(ON_GPU)
        (root / name / "config.pbtxt").write_text(CONFIG + "instance_group [ { kind: KIND_CPU } ]\n")
    server = ServerProcess(
        [root], ["--model-control-mode=explicit", "--model-load-on-demand", "--model-memory-budget=gpu:0=7GB"]
    ).start(timeout=300)
    try:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=300)
        for name in ("gpu_a", "gpu_b"):
            assert _infer(client, name).tolist() == [[1.0] * 4]
        assert _infer(client, "gpu_a").tolist() == [[1.0] * 4]  # gpu_b is now the least recently used
        sizes = {
            name: _sample(server, f'coreserve_model_gpu_memory_bytes{{model="{name}",gpu="0"}}')
            for name in ("gpu_a", "gpu_b")
        }
        assert all(size >= 2 * 2**30 for size in sizes.values()), sizes
        assert _infer(client, "gpu_c").tolist() == [[1.0] * 4]
        index = _index(server)
        assert index["gpu_b"]["state"] == "UNAVAILABLE" and index["gpu_a"]["state"] == "READY"
        assert _sample(server, "coreserve_model_evictions_total") == 1
        assert _sample(server, 'coreserve_model_gpu_memory_budget_bytes{gpu="0"}') == 7 * 10**9
        client.close()
        log = server.log
    finally:
        server.close()  # deletes the log file
    assert "Traceback" not in log


@pytest.mark.skipif(bool(GPU_UNUSABLE), reason=GPU_UNUSABLE or "GPU 0 is usable")
def test_a_gpu_budget_in_percent_is_that_share_of_the_gpus_memory(tmp_path: Path) -> None:
    """`gpu:0=25%` is a quarter of the memory NVML reports for GPU 0. Runs on a GPU machine."""
    import pynvml

    pynvml.nvmlInit()
    try:
        total = int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).total)
    finally:
        pynvml.nvmlShutdown()
    (tmp_path / "models").mkdir()
    server = ServerProcess(
        [tmp_path / "models"], ["--model-control-mode=explicit", "--model-memory-budget=gpu:0=25%"]
    ).start(timeout=120)
    try:
        assert _sample(server, 'coreserve_model_gpu_memory_budget_bytes{gpu="0"}') == total // 4
        log = server.log
    finally:
        server.close()  # deletes the log file
    assert "Traceback" not in log
