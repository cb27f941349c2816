"""GPU memory given back on unload: test_unload_memory.py's cycles, for a model on the GPU.

A KIND_GPU torch model with 256 MiB of weights is loaded, checked and unloaded 50 times through
the repository API of a coreserve in explicit mode, and GPU 0's used memory is read through NVML
(what the memory budgets read). After the 50th unload it must be within GPU_GROWTH_MIB of what
it was after the first: the first load pays for the server's CUDA context, which stays, and an
unload must give back the weights and what torch cached for them. Runs on a GPU machine
(.ci/gpu-tests).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from soak.unload import explicit_server

from coreserve.repository.memory._gpu import GpuMemoryReader
from support.gpu_checks import gpu_0_unusable
from support.gpu_memory import used_after_unload

CYCLES = 50
WIDTH = 8192  # one Linear(8192, 8192): 256 MiB of FP32 weights
# A leak of a tenth of the weights a cycle passes this by the sixth cycle. cuBLAS keeps a
# workspace (up to 32 MiB on Hopper) per thread that has run a matmul, which may come later.
GPU_GROWTH_MIB = 128
CONFIG = f"""
backend: "pytorch"
max_batch_size: 4
input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ {WIDTH} ] }} ]
output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ {WIDTH} ] }} ]
instance_group [ {{ kind: KIND_GPU gpus: [ 0 ] }} ]
"""
GPU_UNUSABLE = gpu_0_unusable()


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray, np.ndarray]:
    """The model `weights` and a request with its answer, computed here on the CPU."""
    import torch

    root = tmp_path_factory.mktemp("gpu_unload") / "models"
    (root / "weights" / "1").mkdir(parents=True)
    (root / "weights" / "config.pbtxt").write_text(CONFIG)
    torch.manual_seed(0)
    linear = torch.nn.Linear(WIDTH, WIDTH)
    with warnings.catch_warnings():  # torch deprecates TorchScript; Triton users still have model.pt files
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.save(torch.jit.script(linear), str(root / "weights" / "1" / "model.pt"))
    x = np.random.default_rng(0).standard_normal((1, WIDTH)).astype(np.float32)
    with torch.no_grad():
        expected = linear(torch.from_numpy(x)).numpy()
    return root, x, expected


@pytest.mark.skipif(bool(GPU_UNUSABLE), reason=GPU_UNUSABLE or "GPU 0 is usable")
@pytest.mark.timeout(300)  # 50 loads of 256 MiB: its own bound, above a run's shorter per-test one
def test_fifty_unloads_of_a_gpu_model_give_its_memory_back(
    repository: tuple[Path, np.ndarray, np.ndarray],
) -> None:
    root, x, expected = repository
    with explicit_server(root) as server:
        after_unloads = _cycles(server.http_url, x, expected)
        log = server.log
    growth_mib = (after_unloads[-1] - after_unloads[0]) / 2**20
    assert growth_mib <= GPU_GROWTH_MIB, [round(used / 2**20) for used in after_unloads]
    assert "Traceback" not in log


def _cycles(url: str, x: np.ndarray, expected: np.ndarray) -> list[int]:
    """GPU 0's used memory after each unload: settled after the first and the last, as read
    right away after the others (for the failure's message)."""
    gpu = GpuMemoryReader.open([0])
    client = httpclient.InferenceServerClient(url, network_timeout=300)
    after_unloads: list[int] = []
    try:
        for cycle in range(CYCLES):
            client.load_model("weights")
            tensor = httpclient.InferInput("INPUT__0", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x)
            answer = client.infer("weights", [tensor]).as_numpy("OUTPUT__0")
            np.testing.assert_allclose(answer, expected, rtol=1e-2, atol=1e-2)  # cuBLAS against the CPU
            client.unload_model("weights")
            if cycle == 0:
                after_unloads.append(used_after_unload(gpu, 0, None))
            elif cycle == CYCLES - 1:
                after_unloads.append(used_after_unload(gpu, 0, after_unloads[0] + GPU_GROWTH_MIB * 2**20))
            else:
                after_unloads.append(gpu.used()[0])
    finally:
        client.close()
        gpu.close()
    return after_unloads
