"""A model on a real GPU in a server of several workers (runs on a GPU machine: .ci/gpu-tests).

Triton counts a KIND_GPU group's instances per server: worker 0 alone loads them, and is the
one worker process with a CUDA context on the GPU; the other workers send it their requests.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from support.gpu_checks import gpu_0_unusable
from support.model_builders import ADD_SUB_CONFIG, add_sub_model, write_model
from support.servers.worker_servers import CONNECTIONS, answer_of, start_workers, worker_index, worker_pids

GPU_UNUSABLE = gpu_0_unusable()


class OnCuda(torch.nn.Module):
    """Ones where the input came to the module on a CUDA device, zeros where on the CPU."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.full_like(x, float(x.is_cuda))


ON_GPU_CONFIG = """
backend: "pytorch"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { kind: KIND_GPU count: 2 gpus: [ 0 ] } ]
"""

BODY = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [5, 6, 7, 8]}]})


def _processes_on_gpu_0() -> set[int]:
    import pynvml

    pynvml.nvmlInit()
    try:
        device = pynvml.nvmlDeviceGetHandleByIndex(0)
        return {process.pid for process in pynvml.nvmlDeviceGetComputeRunningProcesses(device)}
    finally:
        pynvml.nvmlShutdown()


@pytest.mark.skipif(bool(GPU_UNUSABLE), reason=GPU_UNUSABLE or "GPU 0 is usable")
def test_a_kind_gpu_model_runs_on_the_gpu_in_worker_0_alone(tmp_path: Path) -> None:
    write_model(tmp_path, "add_sub", add_sub_model(), ADD_SUB_CONFIG)
    (tmp_path / "on_gpu" / "1").mkdir(parents=True)
    with warnings.catch_warnings():  # torch deprecates TorchScript; Triton users still have model.pt files
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.save(torch.jit.script(OnCuda()), str(tmp_path / "on_gpu" / "1" / "model.pt"))
    (tmp_path / "on_gpu" / "config.pbtxt").write_text(ON_GPU_CONFIG)
    before = _processes_on_gpu_0()
    server = start_workers(tmp_path, "--load-model=on_gpu")
    try:
        for _ in range(CONNECTIONS):  # each on a connection of its own: through both workers
            status, body = answer_of(server, "POST", "/v2/models/on_gpu/infer", BODY)
            assert status == 200, body
            assert json.loads(body)["outputs"][0]["data"] == [1.0] * 4  # it ran on a CUDA device
        status, body = answer_of(server, "GET", "/v2/models/on_gpu/stats")
        stats = json.loads(body)["model_stats"][0]
        assert status == 200 and stats["inference_count"] == CONNECTIONS
        # One process more on the GPU: worker 0 (NVML gives the host's process ids; where the
        # test runs in another PID namespace, only their count can be checked).
        started = _processes_on_gpu_0() - before
        assert len(started) == 1, started
        assert server.process is not None
        ours = {server.process.pid, *worker_pids(server)}
        if started & ours:
            owner = {pid for pid in worker_pids(server) if worker_index(pid) == 0}
            assert started == owner, (started, owner)
        forwarded = "model 'on_gpu' version 1 is served by worker 0 for every worker (its GPU instances"
        assert server.log.count(forwarded) == 1  # by the other worker
        assert "Traceback" not in server.log
    finally:
        server.close()
