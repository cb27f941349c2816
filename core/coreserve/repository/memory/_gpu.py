"""The used memory of the GPUs that have a model memory budget, read through NVML.

A model's size on a GPU is what that GPU's used memory grew by while the model loaded (loads
are one at a time under a budget). NVML reports the GPU's whole use, so a load of another
process on the same GPU at that moment is counted too; per-process figures would avoid that,
but NVML gives none in most containers (their process ids are not the host's).

A budget names a GPU by the CUDA id the models use (`instance_group { gpus }`, `cuda:N`): the
N-th device of CUDA_VISIBLE_DEVICES where it is set (an index or a UUID), else NVML's N-th.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterable
from typing import Any

from coreserve.errors import UnavailableError
from coreserve.repository.memory.budgets import MemoryBudgetError, Percent


class GpuMemoryReader:
    """NVML's used memory of some GPUs, by their CUDA id."""

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
        except nvml.NVMLError as exc:
            raise MemoryBudgetError(
                f"a GPU model memory budget ({named}) needs NVML, which is not usable here ({exc})"
            ) from None
        try:
            return cls(nvml, {device: _handle(nvml, device) for device in wanted})
        except BaseException:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlShutdown()
            raise

    def used(self) -> dict[int, int]:
        """Each GPU's used memory now, in bytes; UnavailableError where NVML cannot say."""
        return self._read("used")

    def totals(self) -> dict[int, int]:
        """Each GPU's memory, in bytes; UnavailableError where NVML cannot say."""
        return self._read("total")

    def _read(self, field: str) -> dict[int, int]:
        try:
            info = self._nvml.nvmlDeviceGetMemoryInfo
            return {device: int(getattr(info(handle), field)) for device, handle in self._handles.items()}
        except self._nvml.NVMLError as exc:
            raise UnavailableError(f"the GPUs' memory cannot be read through NVML now ({exc})") from None

    def in_bytes(self, budgets: dict[int, int | Percent]) -> dict[int, int]:
        """Each GPU's budget in bytes (a percentage is of the memory NVML reports for its GPU);
        raises MemoryBudgetError (and closes NVML) where that cannot be read."""
        try:
            totals = self.totals()
        except UnavailableError as exc:
            self.close()
            raise MemoryBudgetError(
                f"a GPU model memory budget needs the GPU's size: {exc.message}"
            ) from None
        return {gpu: b.of(totals[gpu]) if isinstance(b, Percent) else b for gpu, b in budgets.items()}

    def close(self) -> None:
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()


def _handle(nvml: Any, device: int) -> Any:
    """NVML's handle of CUDA device `device`; MemoryBudgetError where there is none."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        if visible is None:
            count = nvml.nvmlDeviceGetCount()
            if device >= count:
                raise MemoryBudgetError(
                    f"a model memory budget names GPU {device}, and NVML finds {count} GPU(s) here"
                )
            return nvml.nvmlDeviceGetHandleByIndex(device)
        entries = [entry.strip() for entry in visible.split(",") if entry.strip()]
        if device >= len(entries):
            raise MemoryBudgetError(
                f"a model memory budget names GPU {device}, and CUDA_VISIBLE_DEVICES='{visible}' shows "
                f"{len(entries)} GPU(s)"
            )
        entry = entries[device]
        return (
            nvml.nvmlDeviceGetHandleByIndex(int(entry))
            if entry.isdigit()
            else nvml.nvmlDeviceGetHandleByUUID(entry)
        )
    except nvml.NVMLError as exc:
        raise MemoryBudgetError(f"NVML cannot find GPU {device} of a model memory budget ({exc})") from None
