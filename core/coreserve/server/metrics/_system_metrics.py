"""Triton's polled metric families: CPU (from /proc) and GPU (through NVML), as Prometheus text.

Triton reads these every `--metrics-interval-ms` rather than on each scrape; so does the
`SystemMetrics` poller here, and a scrape returns what the last poll found. NVML comes from
the `nvidia-ml-py` package, imported only when GPU metrics are asked for and the server
starts; without it (or without a GPU) the GPU families are absent and one log line says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def family(name: str, kind: str, help_text: str, samples: Iterable[str]) -> list[str]:
    """One metric family in Prometheus text format: HELP, TYPE and its samples."""
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *samples]


class CpuMetrics:
    """Triton's CPU gauges: utilization since the previous poll, total and used memory."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self._stat = proc / "stat"
        self._meminfo = proc / "meminfo"
        self._last: tuple[int, int] | None = None

    def poll(self) -> list[str]:
        if not self._stat.exists() or not self._meminfo.exists():
            return []
        fields = [int(value) for value in self._stat.read_text().splitlines()[0].split()[1:9]]
        idle, total = fields[3] + (fields[4] if len(fields) > 4 else 0), sum(fields)
        utilization = 0.0
        if self._last is not None and total > self._last[1]:
            utilization = 1.0 - (idle - self._last[0]) / (total - self._last[1])
        self._last = (idle, total)
        memory = {}
        for line in self._meminfo.read_text().splitlines():
            key, _, rest = line.partition(":")
            if rest.split():
                memory[key] = int(rest.split()[0]) * 1024
        total_bytes = memory.get("MemTotal", 0)
        # Used = total - available, as Triton counts it.
        used_bytes = total_bytes - memory.get("MemAvailable", memory.get("MemFree", 0))
        return [
            *family(
                "nv_cpu_utilization",
                "gauge",
                "CPU utilization rate [0.0 - 1.0]",
                [f"nv_cpu_utilization {utilization:.6g}"],
            ),
            *family(
                "nv_cpu_memory_total_bytes",
                "gauge",
                "CPU total memory (RAM), in bytes",
                [f"nv_cpu_memory_total_bytes {total_bytes}"],
            ),
            *family(
                "nv_cpu_memory_used_bytes",
                "gauge",
                "CPU used memory (RAM), in bytes",
                [f"nv_cpu_memory_used_bytes {used_bytes}"],
            ),
        ]


# Triton's GPU families: name, type, HELP text. Each sample carries the label gpu_uuid.
GPU_FAMILIES = (
    ("nv_gpu_utilization", "gauge", "GPU utilization rate [0.0 - 1.0)"),
    ("nv_gpu_memory_total_bytes", "gauge", "GPU total memory, in bytes"),
    ("nv_gpu_memory_used_bytes", "gauge", "GPU used memory, in bytes"),
    ("nv_gpu_power_usage", "gauge", "GPU power usage in watts"),
    ("nv_gpu_power_limit", "gauge", "GPU power management limit in watts"),
    ("nv_energy_consumption", "counter", "GPU energy consumption in joules since the Triton Server started"),
)


class GpuMetrics:
    """Triton's GPU families read through NVML, one sample per GPU labelled by its UUID."""

    def __init__(self, nvml: Any, handles: list[Any]) -> None:
        self._nvml = nvml
        self._handles = handles
        self._uuids = [_text(nvml.nvmlDeviceGetUUID(handle)) for handle in handles]
        self._energy_start = [self._read(nvml.nvmlDeviceGetTotalEnergyConsumption, h) for h in handles]

    @classmethod
    def open(cls) -> tuple[GpuMetrics | None, str]:
        """NVML's GPUs, or None and the reason there are none to report."""
        try:  # nvidia-ml-py: optional, only for --allow-gpu-metrics
            pynvml = importlib.import_module("pynvml")
        except ImportError:
            return None, "the nvidia-ml-py package (NVML) is not installed"
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(index) for index in range(count)]
        except pynvml.NVMLError as exc:
            return None, f"NVML is not usable here ({exc})"
        if not handles:
            return None, "NVML finds no GPU"
        return cls(pynvml, handles), f"{len(handles)} GPU(s)"

    def _read(self, call: Callable[[Any], Any], handle: Any) -> Any:
        """An NVML reading, or None where this GPU does not support it."""
        try:
            return call(handle)
        except self._nvml.NVMLError:
            return None

    def poll(self) -> list[str]:
        nvml = self._nvml
        values: dict[str, list[str]] = {name: [] for name, _, _ in GPU_FAMILIES}
        for index, handle in enumerate(self._handles):
            labels = f'{{gpu_uuid="{self._uuids[index]}"}}'
            rates = self._read(nvml.nvmlDeviceGetUtilizationRates, handle)
            memory = self._read(nvml.nvmlDeviceGetMemoryInfo, handle)
            power = self._read(nvml.nvmlDeviceGetPowerUsage, handle)  # milliwatts
            limit = self._read(nvml.nvmlDeviceGetPowerManagementLimit, handle)  # milliwatts
            energy = self._read(nvml.nvmlDeviceGetTotalEnergyConsumption, handle)  # millijoules
            if rates is not None:
                values["nv_gpu_utilization"].append(f"nv_gpu_utilization{labels} {rates.gpu / 100:.6g}")
            if memory is not None:
                values["nv_gpu_memory_total_bytes"].append(
                    f"nv_gpu_memory_total_bytes{labels} {memory.total}"
                )
                values["nv_gpu_memory_used_bytes"].append(f"nv_gpu_memory_used_bytes{labels} {memory.used}")
            if power is not None:
                values["nv_gpu_power_usage"].append(f"nv_gpu_power_usage{labels} {power / 1000:.6g}")
            if limit is not None:
                values["nv_gpu_power_limit"].append(f"nv_gpu_power_limit{labels} {limit / 1000:.6g}")
            start = self._energy_start[index]
            if energy is not None and start is not None:
                joules = (energy - start) / 1000
                values["nv_energy_consumption"].append(f"nv_energy_consumption{labels} {joules:.6g}")
        lines: list[str] = []
        for name, kind, help_text in GPU_FAMILIES:
            if values[name]:
                lines.extend(family(name, kind, help_text, values[name]))
        return lines

    def close(self) -> None:
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class SystemMetrics:
    """Polls the CPU and GPU families every `interval_ms`; `render` gives the last reading."""

    def __init__(self, *, cpu: bool, gpu: bool, interval_ms: float) -> None:
        self._cpu = CpuMetrics() if cpu else None
        self._want_gpu = gpu
        self._gpu: GpuMetrics | None = None
        self._interval = interval_ms / 1000
        self._text = ""
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._want_gpu:
            self._gpu, found = GpuMetrics.open()
            if self._gpu is None:
                logger.info("GPU metrics are not reported: %s", found)
            else:
                logger.info("Collecting GPU metrics: %s", found)
        if self._cpu is not None:
            logger.info("Collecting CPU metrics")
        if self._cpu is None and self._gpu is None:
            return
        self._poll()  # a first reading: the first utilization covers the first interval
        self._task = asyncio.create_task(self._poll_forever(), name="metrics-poller")

    def render(self) -> str:
        return self._text

    def _poll(self) -> None:
        lines = (self._cpu.poll() if self._cpu else []) + (self._gpu.poll() if self._gpu else [])
        self._text = "\n".join(lines) + "\n" if lines else ""

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                # NVML calls block for a while; /proc reads do not, but both leave the loop free.
                await asyncio.to_thread(self._poll)
            except Exception:
                logger.exception("polling the CPU and GPU metrics failed; they keep their last values")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._gpu is not None:
            self._gpu.close()
