"""coreserve.backend.cuda_driver_gpus: the GPUs the CUDA driver shows, or none."""

from __future__ import annotations

import os
import subprocess
import sys

from coreserve.backend import cuda_driver_gpus


def test_the_ids_count_from_zero() -> None:
    gpus = cuda_driver_gpus()
    assert gpus == tuple(range(len(gpus)))
    assert cuda_driver_gpus() is gpus  # found once per process


def test_cuda_visible_devices_hides_every_gpu() -> None:
    script = "from coreserve.backend import cuda_driver_gpus; print(cuda_driver_gpus())"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    found = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True, timeout=60
    )
    assert found.stdout.strip() == "()"
