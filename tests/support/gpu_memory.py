"""A GPU's used memory after an unload, read through NVML as the server's memory budgets read it.

NVML sees the whole GPU, not one process: what the server process keeps for good (its CUDA
context, from its first load on) counts too, so tests compare with the use after a first unload.
"""

from __future__ import annotations

import time

from coreserve.repository.memory._gpu import GpuMemoryReader

# An instance closes a moment after its unload is answered, and then gives its memory back.
FIRST_SETTLE_S = 3.0


def used_after_unload(gpu: GpuMemoryReader, device: int, target: int | None, settle_s: float = 30.0) -> int:
    """The device's used memory once an unload has given back what it gives: FIRST_SETTLE_S
    seconds after it without a `target`, else as soon as it is at or below `target`, or after
    `settle_s` seconds (the test then reports what is left)."""
    time.sleep(FIRST_SETTLE_S if target is None else 0.0)
    deadline = time.monotonic() + settle_s
    while True:
        used = gpu.used()[device]
        if target is None or used <= target or time.monotonic() > deadline:
            return used
        time.sleep(0.25)
