"""CUDA graphs in plugin-torch (parameter `coreserve_cuda_graphs`), through real servers.

Where graphs cannot work the load fails, saying why (these run anywhere). On a GPU (.ci/gpu-tests)
the load captures every batch size and serving captures none; a captured model answers as the same
model run without graphs, for every batch size the batcher forms, under concurrent requests, always
off the event loop; the load's measured memory counts the graphs, and a reload or unload gives
their memory back while other models keep theirs.
"""

from __future__ import annotations

import asyncio
import re
import threading
import urllib.request
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.backend import InstanceKind, InstancePlacement, ModelFiles, ServerContext
from coreserve.config import parse_config
from coreserve.repository.memory._gpu import GpuMemoryReader
from coreserve.testing import ServerProcess
from coreserve_torch._loading import _failure, create_instance
from support.gpu_checks import gpu_0_unusable
from support.gpu_memory import used_after_unload
from torch_models import AddSub, Cumulative, Double, HeavySynchronizing, Mlp, Synchronizing

GPU = torch.cuda.is_available()
GPU_UNUSABLE = gpu_0_unusable()
GRAPHS = 'parameters { key: "coreserve_cuda_graphs" value: { string_value: "%s" } }'
# The captured MLP and its twin without graphs: the same weights (one module saved twice).
WIDTH, HIDDEN, MAX_BATCH = 64, 256, 8


def _config(extra: str, max_batch: int = 8, dims: str = "[ 4 ]", input_extra: str = "") -> str:
    return (
        f'backend: "pytorch"\nmax_batch_size: {max_batch}\n'
        f'input [ {{ name: "x" data_type: TYPE_FP32 dims: {dims} {input_extra} }} ]\n'
        f'output [ {{ name: "y" data_type: TYPE_FP32 dims: {dims} }} ]\n{extra}\n'
    )


def _save(root: Path, name: str, module: torch.nn.Module, config: str) -> None:
    (root / name / "1").mkdir(parents=True)
    with warnings.catch_warnings():  # torch deprecates TorchScript; Triton users still have model.pt files
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.save(torch.jit.script(module), str(root / name / "1" / "model.pt"))
    (root / name / "config.pbtxt").write_text(config)


def _infer(client: httpclient.InferenceServerClient, model: str, x: np.ndarray) -> np.ndarray:
    tensor = httpclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer(model, [tensor]).as_numpy("y")
    assert result is not None
    return result


# --- where graphs cannot work: the load fails, saying why --------------------------------------

CPU_GROUP = "instance_group [ { kind: KIND_CPU } ]"
REFUSED = {
    "on_cpu": (
        _config(f"{GRAPHS % 'true'}\n{CPU_GROUP}"),
        "model 'on_cpu': CUDA graphs need the model on a GPU: instance 'on_cpu_0_0' is KIND_CPU",
    ),
    "not_a_bool": (
        _config(GRAPHS % "sometimes"),
        "model 'not_a_bool': parameter 'coreserve_cuda_graphs' must be true or false, got 'sometimes'",
    ),
    "variable_dims": (
        _config(GRAPHS % "true", dims="[ -1 ]"),
        "model 'variable_dims': CUDA graphs need fixed shapes, and input 'x' has a variable dimension: dims [-1]",
    ),
    "unbatched_variable_dims": (
        _config(GRAPHS % "true", max_batch=0, dims="[ 2, -1 ]"),
        "model 'unbatched_variable_dims': CUDA graphs need fixed shapes, and input 'x' has a variable "
        "dimension: dims [2, -1]",
    ),
    "ragged": (
        _config(f"{GRAPHS % 'true'}\ndynamic_batching {{ }}", input_extra="allow_ragged_batch: true"),
        "model 'ragged': CUDA graphs need fixed shapes, and input 'x' allows ragged batches",
    ),
}


@pytest.fixture(scope="module")
def explicit_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("graphs_refused")
    for name, (config, _) in REFUSED.items():
        _save(root, name, Double(), config)
    _save(root, "off", Double(), _config(f"{GRAPHS % 'false'}\n{CPU_GROUP}"))
    _save(root, "no_group", Double(), _config(GRAPHS % "true"))
    server = ServerProcess([root], ["--model-control-mode=explicit"]).start(timeout=180)
    yield server
    server.close()


@pytest.fixture
def client(explicit_server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(explicit_server.http_url, network_timeout=120)
    yield client
    client.close()


def _refusal(client: httpclient.InferenceServerClient, model: str) -> str:
    """The load's error (a 400) and the model's state, which must say the same."""
    with pytest.raises(InferenceServerException) as info:
        client.load_model(model)
    assert info.value.status() == "400", info.value
    entry = next(entry for entry in client.get_model_repository_index() if entry["name"] == model)
    assert entry["state"] == "UNAVAILABLE" and entry["reason"] in str(info.value.message()), entry
    return str(info.value.message())


@pytest.mark.parametrize("model", sorted(REFUSED))
def test_a_model_graphs_cannot_serve_fails_to_load_saying_why(
    explicit_server: ServerProcess, client: httpclient.InferenceServerClient, model: str
) -> None:
    assert REFUSED[model][1] in _refusal(client, model)
    assert "Traceback" not in explicit_server.log  # a configuration mistake, not a server fault


@pytest.mark.skipif(GPU, reason="torch sees a CUDA device here: a model without instance_group goes on it")
def test_without_cuda_a_model_without_instance_group_is_refused_for_its_cpu_instance(
    client: httpclient.InferenceServerClient,
) -> None:
    assert (
        "CUDA graphs need the model on a GPU: instance 'no_group_0' is KIND_CPU, and this torch sees "
        "no CUDA device (parameter coreserve_cuda_graphs)"
    ) in _refusal(client, "no_group")


def test_graphs_turned_off_change_nothing(client: httpclient.InferenceServerClient) -> None:
    client.load_model("off")
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(_infer(client, "off", x), 2 * x)


# --- on a GPU: the same answers as without graphs, and memory given back -----------------------

needs_gpu = pytest.mark.skipif(
    not GPU, reason="no CUDA: torch sees no CUDA device (a CUDA build of torch and an NVIDIA GPU)"
)


def _mlp_config(extra: str) -> str:
    return (
        f'backend: "pytorch"\nmax_batch_size: {MAX_BATCH}\n'
        f'input [ {{ name: "x" data_type: TYPE_FP32 dims: [ {WIDTH} ] }} ]\n'
        f'output [ {{ name: "y" data_type: TYPE_FP32 dims: [ {WIDTH} ] }} ]\n'
        "dynamic_batching { max_queue_delay_microseconds: 20000 }\n"
        f"{extra}\n"
    )


@pytest.fixture(scope="module")
def gpu_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """`captured` (two instances on GPU 0 with graphs), `eager` (the same module without) and
    `uncapturable` (a model that synchronises inside forward(), with graphs)."""
    root = tmp_path_factory.mktemp("graphs")
    torch.manual_seed(0)
    mlp = Mlp(WIDTH, HIDDEN)
    _save(
        root,
        "captured",
        mlp,
        _mlp_config(f"{GRAPHS % 'true'}\ninstance_group [ {{ kind: KIND_GPU count: 2 gpus: [ 0 ] }} ]"),
    )
    _save(root, "eager", mlp, _mlp_config("instance_group [ { kind: KIND_GPU gpus: [ 0 ] } ]"))
    _save(
        root,
        "uncapturable",
        Synchronizing(),
        _mlp_config(f"{GRAPHS % 'true'}\ninstance_group [ {{ kind: KIND_GPU gpus: [ 0 ] }} ]"),
    )
    server = ServerProcess([root], ["--exit-on-error=false"]).start(timeout=300)
    yield server
    server.close()


def _captures(log: str, model: str) -> list[tuple[str, int]]:
    """(instance, graphs) of each line in which an instance of `model` says what its load captured."""
    pattern = rf"model '{model}': instance '(\S+)' captured (\d+) CUDA graphs? \(batch sizes 1 to (\d+)\) in "
    found = re.findall(pattern, log)
    assert all(int(count) == int(largest) for _, count, largest in found), found
    return [(instance, int(count)) for instance, count, _ in found]


def _rows(batch: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, WIDTH)).astype(np.float32)


def _assert_same(captured: np.ndarray, eager: np.ndarray) -> None:
    # The same kernels on the same GPU; the margin covers cuBLAS choosing another algorithm for
    # another stream, or for a batch the batcher made of other sizes than the eager call's.
    np.testing.assert_allclose(captured, eager, rtol=1e-5, atol=1e-5)


@needs_gpu
def test_the_load_captures_every_batch_size_and_serving_captures_none(gpu_server: ServerProcess) -> None:
    at_load = _captures(gpu_server.log, "captured")
    assert sorted(at_load) == [("captured_0_0", MAX_BATCH), ("captured_0_1", MAX_BATCH)], at_load
    client = httpclient.InferenceServerClient(gpu_server.http_url, network_timeout=120)
    try:
        # One request at a time: each forms a batch of its own size, every size once, some again.
        sizes = [1, 4, 2, 8, 3, 1, 5, 8, 6, 7, 4]
        for seed, size in enumerate(sizes):
            x = _rows(size, seed)
            _assert_same(_infer(client, "captured", x), _infer(client, "eager", x))
    finally:
        client.close()
    assert _captures(gpu_server.log, "captured") == at_load  # no capture while serving
    assert len(re.findall(r"captured \d+ CUDA graph", gpu_server.log)) == 2, gpu_server.log  # none for eager


@needs_gpu
def test_concurrent_requests_answer_as_without_graphs(gpu_server: ServerProcess) -> None:
    inputs = [_rows(1 + seed % 3, 100 + seed) for seed in range(48)]

    def call(x: np.ndarray) -> np.ndarray:
        client = httpclient.InferenceServerClient(gpu_server.http_url, network_timeout=120)
        try:
            return _infer(client, "captured", x)
        finally:
            client.close()

    client = httpclient.InferenceServerClient(gpu_server.http_url, network_timeout=120)
    try:
        executions = _executions(client)
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(call, inputs))
        assert _executions(client) - executions < len(inputs)  # the batcher formed batches of them
        for x, answer in zip(inputs, answers, strict=True):
            _assert_same(answer, _infer(client, "eager", x))
    finally:
        client.close()
    assert len(_captures(gpu_server.log, "captured")) == 2  # the load's, and no other
    assert "Traceback" not in gpu_server.log


@needs_gpu
def test_a_model_a_graph_cannot_capture_fails_to_load_and_the_gpu_serves_on(
    gpu_server: ServerProcess,
) -> None:
    client = httpclient.InferenceServerClient(gpu_server.http_url, network_timeout=120)
    try:
        entry = next(e for e in client.get_model_repository_index() if e["name"] == "uncapturable")
        assert entry["state"] == "UNAVAILABLE", entry
        assert "model 'uncapturable': instance 'uncapturable_0" in entry["reason"], entry
        # The root cause (the read-back inside forward()) first, then what the capture ended with.
        assert re.search(
            r"cannot run as a CUDA graph \(parameter coreserve_cuda_graphs\): a batch of zeros failed: "
            r"RuntimeError: CUDA error: operation not permitted when stream is capturing "
            r"\(then: RuntimeError: .*capture",
            entry["reason"],
        ), entry
        assert "TorchScript interpreter" not in entry["reason"], entry
        x = _rows(3, 7)
        _assert_same(_infer(client, "captured", x), _infer(client, "eager", x))
    finally:
        client.close()
    assert "Traceback" not in gpu_server.log


def _executions(client: httpclient.InferenceServerClient) -> int:
    return int(client.get_inference_statistics("captured")["model_stats"][0]["execution_count"])


# A wide hidden layer, so that the graphs of batches of 5 to 8 hold segments of 20 MiB (the
# caching allocator's size for blocks over 1 MiB) in their pool and their results: graphs that
# stayed would leave over 40 MiB a cycle (a load and a reload). The margin is for cuBLAS, which keeps a workspace (up to
# 32 MiB) for each thread's handle that has run on the graphs' stream.
RELOAD_HIDDEN = 65536
RELOAD_CYCLES = 10
GRAPHS_GROWTH_MIB = 96


@pytest.mark.skipif(bool(GPU_UNUSABLE), reason=GPU_UNUSABLE or "GPU 0 is usable")
def test_reloads_and_unloads_give_the_graphs_memory_back(tmp_path: Path) -> None:
    torch.manual_seed(0)
    _save(
        tmp_path,
        "captured",
        Mlp(WIDTH, RELOAD_HIDDEN),
        _mlp_config(f"{GRAPHS % 'true'}\ninstance_group [ {{ kind: KIND_GPU gpus: [ 0 ] }} ]"),
    )
    server = ServerProcess([tmp_path], ["--model-control-mode=explicit"]).start(timeout=300)
    try:
        after_unloads = _reload_cycles(server)
        log = server.log
    finally:
        server.close()
    growth_mib = (after_unloads[-1] - after_unloads[0]) / 2**20
    assert growth_mib <= GRAPHS_GROWTH_MIB, [round(used / 2**20) for used in after_unloads]
    assert len(_captures(log, "captured")) == RELOAD_CYCLES * 2  # each load's, of every size
    assert "Traceback" not in log


def _reload_cycles(server: ServerProcess) -> list[int]:
    """Loads, reloads and unloads `captured`, with a batch of each size after each load; returns
    GPU 0's used memory after each unload."""
    gpu = GpuMemoryReader.open([0])
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=300)
    after_unloads: list[int] = []
    try:
        for cycle in range(RELOAD_CYCLES):
            for _ in range(2):  # a load, then a reload of the loaded model
                client.load_model("captured")
                for size in range(1, MAX_BATCH + 1):
                    assert _infer(client, "captured", _rows(size, cycle)).shape == (size, WIDTH)
            client.unload_model("captured")
            target = after_unloads[0] + GRAPHS_GROWTH_MIB * 2**20 if after_unloads else None
            after_unloads.append(used_after_unload(gpu, 0, target))
    finally:
        client.close()
        gpu.close()
    return after_unloads


# Cumulative's graphs at a batch of 8 rows of 4 MiB: three sums of 32 MiB alive at once in the pool.
CUMULATIVE_ROW = 2**20
CUMULATIVE_POOL_MIB = 96
LEFT_BEHIND_MIB = 32  # what an unload or a failed load may leave (torch's small blocks, NVML's rounding)
HEAVY_WEIGHTS = 2**25  # 128 MiB of FP32


@pytest.mark.skipif(bool(GPU_UNUSABLE), reason=GPU_UNUSABLE or "GPU 0 is usable")
def test_graphs_memory_is_counted_at_load_and_freed_at_unload_while_others_stay(tmp_path: Path) -> None:
    """The load's measured GPU memory includes every batch size's graph; the unload of a model with
    graphs gives its pool back while another model with graphs stays loaded; and a model CUDA
    cannot capture leaves neither its weights nor its pool behind."""
    group = "instance_group [ { kind: KIND_GPU gpus: [ 0 ] } ]"
    _save(tmp_path, "resident", Double(), _config(f"{GRAPHS % 'true'}\n{group}"))
    cumulative = (
        f'backend: "pytorch"\nmax_batch_size: {MAX_BATCH}\n'
        f'input [ {{ name: "x" data_type: TYPE_FP32 dims: [ {CUMULATIVE_ROW} ] }} ]\n'
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        f"{GRAPHS % 'true'}\n{group}\n"
    )
    _save(tmp_path, "cumulative", Cumulative(), cumulative)
    _save(tmp_path, "heavy", HeavySynchronizing(HEAVY_WEIGHTS), _config(f"{GRAPHS % 'true'}\n{group}"))
    flags = ["--model-control-mode=explicit", "--model-memory-budget=gpu:0=90%"]
    server = ServerProcess([tmp_path], flags).start(timeout=300)
    gpu = GpuMemoryReader.open([0])
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=300)
    try:
        client.load_model("resident")  # the CUDA context comes with the first model
        before = used_after_unload(gpu, 0, None)
        client.load_model("cumulative")
        counted = _sample(server, 'coreserve_model_gpu_memory_bytes{model="cumulative",gpu="0"}')
        assert counted >= CUMULATIVE_POOL_MIB * 2**20, counted / 2**20
        x = np.ones((MAX_BATCH, CUMULATIVE_ROW), np.float32)
        assert _infer(client, "cumulative", x).shape == (MAX_BATCH, 1)
        client.unload_model("cumulative")
        left = used_after_unload(gpu, 0, before + LEFT_BEHIND_MIB * 2**20) - before
        assert left <= LEFT_BEHIND_MIB * 2**20, left / 2**20
        with pytest.raises(
            InferenceServerException, match="operation not permitted when stream is capturing"
        ):
            client.load_model("heavy")
        left = used_after_unload(gpu, 0, before + LEFT_BEHIND_MIB * 2**20) - before
        assert left <= LEFT_BEHIND_MIB * 2**20, left / 2**20
        np.testing.assert_array_equal(_infer(client, "resident", np.ones((2, 4), np.float32)), 2.0)
    finally:
        client.close()
        gpu.close()
        server.close()
    assert "Traceback" not in server.log


def _sample(server: ServerProcess, name: str) -> float:
    with urllib.request.urlopen(server.metrics_url, timeout=30) as answer:
        text = answer.read().decode()
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, flags=re.M)
    assert match is not None, f"{name} not in the metrics"
    return float(match[1])


@needs_gpu
def test_an_instance_with_graphs_never_runs_on_the_event_loop(tmp_path: Path) -> None:
    """A replay is quick enough for InstanceThread to run it inline, but it waits for the GPU's
    graph stream: with graphs the instance's calls stay on its thread (a threshold of 0)."""
    _save(tmp_path, "tiny", Double(), _config(GRAPHS % "true"))
    files = ModelFiles("tiny", tmp_path / "tiny", 1, "model.pt")
    placement = InstancePlacement(name="tiny_0", group_name="tiny", index=0, kind=InstanceKind.GPU)
    config = parse_config('name: "tiny"\n' + _config(GRAPHS % "true"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.load, in this process
        instance = create_instance(files, config, placement, ServerContext())
    x = np.arange(8, dtype=np.float32).reshape(2, 4)

    def call() -> tuple[int, np.ndarray]:
        return threading.get_ident(), instance.infer({"x": x}, ["y"])["y"]

    async def calls() -> list[tuple[int, np.ndarray]]:
        thread = instance._thread  # the instance's InstanceThread, which learns from its calls
        return [await thread.run(call) for _ in range(64)]

    try:
        answers = asyncio.run(calls())
    finally:
        asyncio.run(instance.close())
    assert threading.get_ident() not in {ident for ident, _ in answers}
    for _, y in answers:
        np.testing.assert_array_equal(y, 2 * x)


def test_a_failed_capture_is_reported_by_its_root_cause() -> None:
    """torch's capture ends (in torch.cuda.graph's __exit__) with an error that names nothing of
    the one that started it, here a TorchScript error, whose own first line names nothing either."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        scripted = torch.jit.script(AddSub())
    with pytest.raises(RuntimeError) as info, _CaptureThatFailsToEnd():
        scripted(torch.zeros(2), torch.zeros(3))
    failure = _failure(info.value)
    assert failure == (
        "RuntimeError: The size of tensor a (2) must match the size of tensor b (3) at non-singleton "
        "dimension 0 (then: RuntimeError: CUDA error: operation failed due to a previous error during capture)"
    ), failure


class _CaptureThatFailsToEnd:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: object) -> None:
        raise RuntimeError(
            "CUDA error: operation failed due to a previous error during capture\nCUDA kernel errors"
        )
