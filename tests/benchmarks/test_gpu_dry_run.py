"""benchmarks/gpu's dry run (tiny models on the CPU) goes through every stage of the device run,
so that the run prepared for the GPU machine does not rot between its rare runs there.

It needs perf_analyzer ($PERF_ANALYZER, as .ci/install-test-tools installs it). The stages that
compare with the real Triton run where it is installed (shared/tools/real-tritonserver, as CI
installs it); elsewhere they must fail alone, saying so, while the others pass.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

from support.paths import REPO

STAGES = {
    "networks",
    "plugin_torch",
    "cuda_graphs",
    "two_models",
    "gpu_memory",
    "python_backend",
    "cpu_workers",
}
TRITON_STAGES = {"python_backend", "cpu_workers"}


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and value > 0


def test_the_dry_run_measures_every_stage(tmp_path) -> None:
    output = tmp_path / "gpu.json"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu", "--dry-run", "--output", str(output), "--budget-s", "150"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=400,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert time.monotonic() - started < 300
    document = json.loads(output.read_text())
    stages, errors = document["data"]["stages"], document["data"]["errors"]
    assert set(stages) == {*STAGES, "targets"}
    # Without the real Triton its stages fail alone, saying so; with it, no stage fails.
    has_triton = not any("the real Triton is not installed" in errors.get(name, "") for name in TRITON_STAGES)
    assert set(errors) == (set() if has_triton else TRITON_STAGES), errors

    torch_stage = stages["plugin_torch"]
    for model in ("resnet50", "bert"):
        assert all(_positive(point["infer_per_s"]) for point in torch_stage[f"{model}_grpc"])
        limit = torch_stage[f"{model}_limit"]
        assert _positive(limit["in_process_limit"]["infer_per_s"]) and _positive(limit["ratio_to_in_process"])
        assert isinstance(limit["p99_at_1_over_in_process_ms"], float)
    for transport in ("http-binary", "shm"):  # one point each, at the shared-memory target's concurrency
        points = torch_stage[f"resnet50_{transport}"]
        assert [point["concurrency"] for point in points] == [2] and _positive(points[0]["infer_per_s"])
    assert _positive(torch_stage["shm_over_http_binary"]["ratio"])
    assert all(_positive(stages["cuda_graphs"][f"concurrency_{c}"]["ratio"]) for c in (1, 2))
    assert stages["cuda_graphs"]["captured"] == []  # the twin runs without graphs on the CPU
    assert all(_positive(stages["two_models"][model]["ratio"]) for model in ("resnet50", "bert"))
    memory = stages["gpu_memory"]["summary"]
    assert memory["usable_samples"] > 0 and memory["memory_relative_difference_median"] < 0.1
    measured = {target["figure"]: target["value"] for target in stages["targets"]["targets"]}
    if has_triton:
        assert all(_positive(stages["python_backend"][f"concurrency_{c}"]["ratio"]) for c in (1, 2))
        assert all(_positive(stages["cpu_workers"][t]["ratio"]) for t in ("http-json", "grpc"))
        assert all(value is not None for value in measured.values()), measured
    assert document["machine"]["software"]["coreserve_commit"]
