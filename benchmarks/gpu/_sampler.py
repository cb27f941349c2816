"""What the server's /metrics says of the GPU under load, beside NVML's own reading taken at
the same moment: nv_gpu_memory_used_bytes and nv_gpu_utilization against pynvml's memory and
utilization. Where there is no GPU (the dry run), the same code compares the CPU's family
nv_cpu_memory_used_bytes with /proc/meminfo, so that the path is exercised with numbers."""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

from benchmarks.gpu._servers import metric_values

MEMORY, UTILIZATION = "nv_gpu_memory_used_bytes", "nv_gpu_utilization"
CPU_MEMORY = "nv_cpu_memory_used_bytes"


def _nvml() -> Any | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml if pynvml.nvmlDeviceGetCount() > 0 else None
    except Exception:  # no NVML, no GPU: the CPU comparison instead
        return None


def _meminfo_used() -> float:
    fields = {}
    with open("/proc/meminfo") as file:
        for line in file:
            key, _, rest = line.partition(":")
            fields[key] = int(rest.split()[0]) * 1024
    return float(fields["MemTotal"] - fields.get("MemAvailable", fields.get("MemFree", 0)))


class Sampler:
    """A thread that reads both sides every `interval_s` while the load runs."""

    def __init__(self, metrics_url: str, interval_s: float = 0.5) -> None:
        self.metrics_url = metrics_url
        self.interval_s = interval_s
        self.nvml = _nvml()
        self.samples: list[dict[str, float]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _reference(self) -> dict[str, float]:
        if self.nvml is None:
            return {"memory": _meminfo_used()}
        handle = self.nvml.nvmlDeviceGetHandleByIndex(0)
        return {
            "memory": float(self.nvml.nvmlDeviceGetMemoryInfo(handle).used),
            "utilization": self.nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100,
        }

    def _run(self) -> None:
        families = (MEMORY, UTILIZATION) if self.nvml is not None else (CPU_MEMORY,)
        while not self._stop.wait(self.interval_s):
            try:
                served = metric_values(self.metrics_url, families)
                reference = self._reference()
            except Exception as exc:  # a missed reading, not a failed run
                self.errors.append(f"{type(exc).__name__}: {exc}")
                continue
            sample = {"t": time.time(), "reference_memory": reference["memory"]}
            if self.nvml is None:
                sample["metrics_memory"] = served.get(CPU_MEMORY, float("nan"))
            else:
                sample["metrics_memory"] = served.get(MEMORY, float("nan"))
                sample["metrics_utilization"] = served.get(UTILIZATION, float("nan"))
                sample["reference_utilization"] = reference["utilization"]
            self.samples.append(sample)

    def summary(self) -> dict[str, Any]:
        """The readings' agreement: memory as the median relative difference, utilization as the
        median absolute one (both sides are averages over different windows)."""
        usable = [s for s in self.samples if s["metrics_memory"] == s["metrics_memory"]]
        result: dict[str, Any] = {
            "what": "GPU (NVML)" if self.nvml is not None else "CPU memory (/proc/meminfo; no GPU here)",
            "samples": len(self.samples),
            "usable_samples": len(usable),
            "errors": self.errors[:5],
        }
        if usable:
            result["metrics_memory_max_bytes"] = max(s["metrics_memory"] for s in usable)
            result["reference_memory_max_bytes"] = max(s["reference_memory"] for s in usable)
            result["memory_relative_difference_median"] = statistics.median(
                abs(s["metrics_memory"] - s["reference_memory"]) / s["reference_memory"] for s in usable
            )
        utilization = [s for s in usable if "metrics_utilization" in s]
        if utilization:
            result["metrics_utilization_max"] = max(s["metrics_utilization"] for s in utilization)
            result["reference_utilization_max"] = max(s["reference_utilization"] for s in utilization)
            result["utilization_difference_median"] = statistics.median(
                abs(s["metrics_utilization"] - s["reference_utilization"]) for s in utilization
            )
        result["series"] = self.samples[-200:]
        return result
