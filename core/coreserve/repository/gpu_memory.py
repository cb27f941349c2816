"""The used memory of the GPUs that have a model memory budget, read through NVML.

A model's size on a GPU is what that GPU's used memory grew by while the model loaded (loads
are one at a time under a budget). NVML reports the GPU's whole use, so a load of another
process on the same GPU at that moment is counted too; per-process figures would avoid that,
but NVML gives none in most containers (their process ids are not the host's).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterable
from typing import Any

from coreserve.repository.memory import MemoryBudgetError


class GpuMemoryReader:
    """NVML's used memory of some GPUs, by their NVML index (the id nvidia-smi shows)."""

    def __init__(self, nvml: Any, handles: dict[int, Any]) -> None:
        self._nvml = nvml
        self._handles = handles

    @classmethod
    def open(cls, devices: Iterable[int]) -> GpuMemoryReader:
        """A reader of `devices`; raises MemoryBudgetError saying why they cannot be read."""
        wanted = sorted(set(devices))
        named = ", ".join(f"gpu:{device}" for device in wanted)
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError:
            raise MemoryBudgetError(
                f"a GPU model memory budget ({named}) reads the GPUs through NVML: pip install nvidia-ml-py"
            ) from None
        try:
            nvml.nvmlInit()
            count = nvml.nvmlDeviceGetCount()
            missing = [device for device in wanted if device >= count]
            if missing:
                raise MemoryBudgetError(
                    f"a model memory budget names GPU {missing[0]}, and NVML finds {count} GPU(s) here"
                )
            handles = {device: nvml.nvmlDeviceGetHandleByIndex(device) for device in wanted}
        except nvml.NVMLError as exc:
            raise MemoryBudgetError(
                f"a GPU model memory budget ({named}) needs NVML, which is not usable here ({exc})"
            ) from None
        return cls(nvml, handles)

    def used(self) -> dict[int, int]:
        """Each GPU's used memory now, in bytes."""
        return {
            device: int(self._nvml.nvmlDeviceGetMemoryInfo(handle).used)
            for device, handle in self._handles.items()
        }

    def close(self) -> None:
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()
