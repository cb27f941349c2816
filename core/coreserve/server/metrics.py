"""Prometheus metrics on `--metrics-port` at `/metrics`, with Triton's names and labels.

Model metrics are read from each version's statistics when Prometheus scrapes, so serving a
request costs no metric updates beyond the statistics it records anyway. Triton's counters
carry no `_total` suffix, which prometheus-client's own writer would add; so these families
are written here, and prometheus-client adds its process, platform and GC collectors.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from pathlib import Path

from aiohttp import web
from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from coreserve.repository import ModelRepository, ModelVersion
from coreserve.scheduling.statistics import HISTOGRAM_BUCKETS_US, ModelStatistics

logger = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
QUANTILES = (0.5, 0.9, 0.95, 0.99)
SUMMARIES = {
    "request": ("nv_inference_request_summary_us", "Summary of inference request durations (success)"),
    "queue": ("nv_inference_queue_summary_us", "Summary of time requests spent queued"),
    "compute_input": ("nv_inference_compute_input_summary_us", "Summary of compute input durations"),
    "compute_infer": ("nv_inference_compute_infer_summary_us", "Summary of compute infer durations"),
    "compute_output": ("nv_inference_compute_output_summary_us", "Summary of compute output durations"),
}
HISTOGRAMS = {
    "request": ("nv_inference_request_latency_us", "Histogram of inference request durations (success)"),
    "queue": ("nv_inference_queue_latency_us", "Histogram of time requests spent queued"),
}


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(**labels: str) -> str:
    return "{" + ",".join(f'{key}="{_escape(value)}"' for key, value in labels.items()) + "}"


def _family(name: str, kind: str, help_text: str, samples: Iterable[str]) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *samples]


def _versions(repository: ModelRepository) -> list[ModelVersion]:
    return [
        version
        for model in repository.models()
        for _, version in sorted(model.versions.items())
        if version.ready or version.statistics.execution_count or version.statistics.fail.count
    ]


def render_model_metrics(repository: ModelRepository) -> str:
    """The model families in Prometheus text format 0.0.4."""
    versions = _versions(repository)
    ids = [(v, _labels(model=v.name, version=str(v.version))) for v in versions]
    lines: list[str] = []

    def counter(name: str, help_text: str, value: Iterable[tuple[str, float]]) -> None:
        lines.extend(
            _family(name, "counter", help_text, (f"{name}{labels} {number:g}" for labels, number in value))
        )

    stats = [(labels, v.statistics) for v, labels in ids]
    counter(
        "nv_inference_request_success",
        "Number of successful inference requests, all batch sizes",
        ((labels, s.success.count) for labels, s in stats),
    )
    failures = (
        (_labels(model=v.name, reason=why, version=str(v.version)), count)
        for v, _ in ids
        for why, count in v.statistics.failures.items()
    )
    counter("nv_inference_request_failure", "Number of failed inference requests, all batch sizes", failures)
    counter(
        "nv_inference_count",
        "Number of inferences performed (a request of batch size N counts N)",
        ((labels, s.inference_count) for labels, s in stats),
    )
    counter(
        "nv_inference_exec_count",
        "Number of model executions performed (a batch counts once)",
        ((labels, s.execution_count) for labels, s in stats),
    )
    counter(
        "nv_inference_request_duration_us",
        "Cumulative inference request duration in microseconds",
        ((labels, s.success.ns // 1000) for labels, s in stats),
    )
    counter(
        "nv_inference_queue_duration_us",
        "Cumulative inference queuing duration in microseconds",
        ((labels, s.queue.ns // 1000) for labels, s in stats),
    )
    counter(
        "nv_inference_compute_input_duration_us",
        "Cumulative compute input duration in microseconds",
        ((labels, s.compute_input.ns // 1000) for labels, s in stats),
    )
    counter(
        "nv_inference_compute_infer_duration_us",
        "Cumulative compute inference duration in microseconds",
        ((labels, s.compute_infer.ns // 1000) for labels, s in stats),
    )
    counter(
        "nv_inference_compute_output_duration_us",
        "Cumulative inference compute output duration in microseconds",
        ((labels, s.compute_output.ns // 1000) for labels, s in stats),
    )
    lines.extend(
        _family(
            "nv_inference_pending_request_count",
            "gauge",
            "Instantaneous number of pending requests awaiting execution per model",
            (
                f"nv_inference_pending_request_count{labels} {v.scheduler.pending if v.scheduler else 0}"
                for v, labels in ids
            ),
        )
    )
    lines.extend(
        _family(
            "nv_model_load_duration_secs",
            "gauge",
            "Time taken to load a model version, in seconds",
            (f"nv_model_load_duration_secs{labels} {v.load_seconds:.6f}" for v, labels in ids),
        )
    )
    for kind, (name, help_text) in SUMMARIES.items():
        samples = list(_summary_samples(name, kind, stats))
        if samples:
            lines.extend(_family(name, "summary", help_text + " over the most recent requests", samples))
    for kind, (name, help_text) in HISTOGRAMS.items():
        samples = list(_histogram_samples(name, kind, ids))
        if samples:
            lines.extend(_family(name, "histogram", help_text, samples))
    return "\n".join(lines) + "\n"


def _summary_samples(name: str, kind: str, stats: list[tuple[str, ModelStatistics]]) -> Iterator[str]:
    for labels, s in stats:
        if kind not in s.recent:
            continue
        window = s.recent[kind]
        inner = labels[1:-1]
        for point, value in zip(QUANTILES, s.quantiles(kind, QUANTILES), strict=True):
            yield f'{name}{{{inner},quantile="{point}"}} {value:g}'
        yield f"{name}_count{labels} {len(window)}"
        yield f"{name}_sum{labels} {sum(window) / 1000:g}"


def _histogram_samples(name: str, kind: str, ids: list[tuple[ModelVersion, str]]) -> Iterator[str]:
    for version, labels in ids:
        s = version.statistics
        counts = s.histograms.get(kind)
        if counts is None:
            continue
        inner = labels[1:-1]
        running = 0
        for bound, count in zip([*HISTOGRAM_BUCKETS_US, float("inf")], counts, strict=True):
            running += count
            le = "+Inf" if bound == float("inf") else f"{bound:g}"
            yield f'{name}_bucket{{{inner},le="{le}"}} {running}'
        total_ns = s.success.ns if kind == "request" else s.queue.ns
        yield f"{name}_count{labels} {running}"
        yield f"{name}_sum{labels} {total_ns / 1000:g}"


class CpuMetrics:
    """Triton's CPU gauges (utilization and memory) read from /proc on Linux."""

    def __init__(self) -> None:
        self._last: tuple[int, int] | None = None

    def render(self) -> str:
        stat, meminfo = Path("/proc/stat"), Path("/proc/meminfo")
        if not stat.exists() or not meminfo.exists():
            return ""
        fields = [int(value) for value in stat.read_text().splitlines()[0].split()[1:]]
        idle, total = fields[3] + (fields[4] if len(fields) > 4 else 0), sum(fields)
        utilization = 0.0
        if self._last is not None and total > self._last[1]:
            utilization = 1.0 - (idle - self._last[0]) / (total - self._last[1])
        self._last = (idle, total)
        memory = {}
        for line in meminfo.read_text().splitlines():
            key, _, rest = line.partition(":")
            memory[key] = int(rest.split()[0]) * 1024
        total_bytes = memory.get("MemTotal", 0)
        used_bytes = total_bytes - memory.get("MemAvailable", memory.get("MemFree", 0))
        lines = [
            *_family(
                "nv_cpu_utilization",
                "gauge",
                "CPU utilization rate [0.0 - 1.0]",
                [f"nv_cpu_utilization {utilization:.6f}"],
            ),
            *_family(
                "nv_cpu_memory_total_bytes",
                "gauge",
                "CPU total memory (RAM), in bytes",
                [f"nv_cpu_memory_total_bytes {total_bytes}"],
            ),
            *_family(
                "nv_cpu_memory_used_bytes",
                "gauge",
                "CPU used memory (RAM), in bytes",
                [f"nv_cpu_memory_used_bytes {used_bytes}"],
            ),
        ]
        return "\n".join(lines) + "\n"


class MetricsFrontend:
    """Serves `/metrics` for one model repository on its own address and port."""

    def __init__(self, repository: ModelRepository, *, address: str, port: int) -> None:
        self._repository = repository
        self._address = address
        self.port = port
        self._process = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self._process)
        PlatformCollector(registry=self._process)
        GCCollector(registry=self._process)
        self._cpu = CpuMetrics()
        self._app = web.Application()
        self._app.router.add_get("/metrics", self._metrics)
        self._runner: web.AppRunner | None = None

    def render(self) -> str:
        return (
            render_model_metrics(self._repository)
            + self._cpu.render()
            + generate_latest(self._process).decode()
        )

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.render().encode(), headers={"Content-Type": CONTENT_TYPE})

    async def start(self) -> None:
        self._runner = web.AppRunner(self._app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._address, self.port, reuse_address=True)
        await site.start()
        self.port = self._runner.addresses[0][1]
        logger.info("Started MetricsService at %s:%d", self._address, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
