"""Prometheus metrics on `--metrics-port` at `/metrics`, with Triton's names, HELP texts and labels.

Model metrics are read from each version's statistics when Prometheus scrapes, so serving a
request costs no metric updates beyond the statistics it records anyway. Triton's counters
carry no `_total` suffix, which prometheus-client's own writer would add; so these families
are written here, and prometheus-client adds its process, platform and GC collectors (names
Triton does not use). Families follow `--metrics-config` as Triton's do: latency counters on,
summaries and histograms off unless asked for.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Iterable, Iterator
from typing import Protocol

from aiohttp import web
from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from coreserve.backend.custom_metrics import CustomMetrics
from coreserve.repository import ModelRepository, ModelVersion
from coreserve.scheduling.cache.responses import CacheStatistics, ResponseCache
from coreserve.scheduling.statistics import (
    FIRST_RESPONSE_FAMILY,
    HISTOGRAM_BUCKETS_US,
    LatencyOptions,
    ModelStatistics,
)
from coreserve.server.metrics._lifecycle import render_lifecycle_metrics
from coreserve.server.metrics._system_metrics import SystemMetrics, family
from coreserve.server.metrics._traffic import render_traffic_metrics
from coreserve.server.traffic import TrafficRouter

logger = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Triton's order of the failure reasons in a scrape.
FAILURE_ORDER = ("OTHER", "BACKEND", "CANCELED", "REJECTED")
_CACHED = "(includes cached requests)"
_NOT_CACHED = "(does not include cached requests)"
# Latency counters (counter_latencies): name, HELP, the statistics' Duration they read.
LATENCY_COUNTERS = (
    ("nv_inference_request_duration_us", f"Cumulative inference request duration in microseconds {_CACHED}",
     "success"),
    ("nv_inference_queue_duration_us", f"Cumulative inference queuing duration in microseconds {_CACHED}",
     "queue"),
    ("nv_inference_compute_input_duration_us",
     f"Cumulative compute input duration in microseconds {_NOT_CACHED}", "compute_input"),
    ("nv_inference_compute_infer_duration_us",
     f"Cumulative compute inference duration in microseconds {_NOT_CACHED}", "compute_infer"),
    ("nv_inference_compute_output_duration_us",
     f"Cumulative inference compute output duration in microseconds {_NOT_CACHED}", "compute_output"),
)  # fmt: skip
# Summaries (summary_latencies): name, HELP (Triton's, word for word), latency kind, Duration.
SUMMARIES = (
    ("nv_inference_request_summary_us", f"Summary of inference request duration in microseconds {_CACHED}",
     "request", "success"),
    ("nv_inference_queue_summary_us", f"Summary of inference queuing duration in microseconds {_CACHED}",
     "queue", "queue"),
    ("nv_inference_compute_input_summary_us",
     f"Cumulative compute input duration in microseconds {_NOT_CACHED}", "compute_input", "compute_input"),
    ("nv_inference_compute_infer_summary_us",
     f"Cumulative compute inference duration in microseconds {_NOT_CACHED}", "compute_infer",
     "compute_infer"),
    ("nv_inference_compute_output_summary_us",
     f"Cumulative inference compute output duration in microseconds {_NOT_CACHED}", "compute_output",
     "compute_output"),
)  # fmt: skip
# Summaries of the response cache, for the models that use it.
CACHE_SUMMARIES = (
    ("nv_cache_hit_summary_per_model", "Summary of cache hit counts/durations per model, in microseconds.",
     "cache_hit", "cache_hit"),
    ("nv_cache_miss_summary_per_model", "Summary of cache miss counts/durations per model, in microseconds.",
     "cache_miss", "cache_miss"),
)  # fmt: skip
FIRST_RESPONSE_HELP = "Duration from request to first response in milliseconds"
# coreserve's own histograms (histogram_latencies), under names Triton does not use.
OWN_HISTOGRAMS = (
    ("coreserve_inference_request_latency_us", "Histogram of successful inference request durations "
     "in microseconds (coreserve)", "request", "success"),
    ("coreserve_inference_queue_latency_us", "Histogram of inference queuing durations in microseconds "
     "(coreserve)", "queue", "queue"),
)  # fmt: skip


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(**labels: str) -> str:
    return "{" + ",".join(f'{key}="{_escape(value)}"' for key, value in labels.items()) + "}"


def _number(value: float) -> str:
    """A sample value: whole numbers in full (no exponent), others to 9 significant digits."""
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    return f"{value:.9g}"


def _versions(repository: ModelRepository) -> list[tuple[ModelVersion, str]]:
    """The versions to report, each with its labels (and, under namespacing, Triton's namespace)."""
    return [
        (version, _version_labels(model.name, model.namespace, version.version))
        for model in repository.models()
        for _, version in sorted(model.versions.items())
        if version.takes_requests or version.statistics.execution_count or version.statistics.fail.count
    ]


def _version_labels(name: str, namespace: str, version: int) -> str:
    if namespace:
        return _labels(model=name, namespace=namespace, version=str(version))
    return _labels(model=name, version=str(version))


def render_model_metrics(repository: ModelRepository, latency: LatencyOptions | None = None) -> str:
    """The model families in Prometheus text format 0.0.4."""
    latency = latency or LatencyOptions()
    ids = _versions(repository)
    stats = [(labels, v.statistics) for v, labels in ids]
    lines: list[str] = []

    def add(name: str, kind: str, help_text: str, samples: Iterable[str]) -> None:
        samples = list(samples)
        if samples:  # as Triton's writer: a family without samples is left out
            lines.extend(family(name, kind, help_text, samples))

    def counter(name: str, help_text: str, values: Iterable[tuple[str, float]]) -> None:
        add(name, "counter", help_text, (f"{name}{labels} {_number(number)}" for labels, number in values))

    counter(
        "nv_inference_request_success",
        "Number of successful inference requests, all batch sizes",
        ((labels, s.success.count) for labels, s in stats),
    )
    counter(
        "nv_inference_request_failure",
        "Number of failed inference requests, all batch sizes",
        (
            (_with_reason(labels, why), v.statistics.failures.get(why, 0))
            for v, labels in ids
            for why in FAILURE_ORDER
        ),
    )
    counter(
        "nv_inference_count",
        f"Number of inferences performed {_NOT_CACHED}",
        ((labels, s.inference_count) for labels, s in stats),
    )
    counter(
        "nv_inference_exec_count",
        f"Number of model executions performed {_NOT_CACHED}",
        ((labels, s.execution_count) for labels, s in stats),
    )
    if latency.counters:
        for name, help_text, duration in LATENCY_COUNTERS:
            counter(name, help_text, ((labels, getattr(s, duration).ns // 1000) for labels, s in stats))
    add(
        "nv_inference_pending_request_count",
        "gauge",
        "Instantaneous number of pending requests awaiting execution per-model.",
        (f"nv_inference_pending_request_count{labels} {v.scheduler.pending if v.scheduler else 0}"
         for v, labels in ids),
    )  # fmt: skip
    add(  # ours: with the pending count, every request in the model
        "coreserve_inference_executing_request_count",
        "gauge",
        "Instantaneous number of requests an instance executes per-model.",
        (f"coreserve_inference_executing_request_count{labels} {v.scheduler.executing if v.scheduler else 0}"
         for v, labels in ids),
    )  # fmt: skip
    add(
        "nv_model_load_duration_secs",
        "gauge",
        "Model load time in seconds",
        (f"nv_model_load_duration_secs{labels} {v.load_seconds:.9g}" for v, labels in ids),
    )
    lines.extend(render_latency_distributions(ids, latency))
    lines.extend(_model_cache_families(ids))
    lines.extend(render_lifecycle_metrics(repository))
    return "\n".join(lines) + "\n" if lines else ""


# Triton's per-model response cache families: name, HELP, the statistics' Duration, count or µs.
MODEL_CACHE_FAMILIES = (
    ("nv_cache_num_hits_per_model", "Number of cache hits per model", "cache_hit", "count"),
    ("nv_cache_hit_duration_per_model", "Total cache hit duration per model, in microseconds",
     "cache_hit", "us"),
    ("nv_cache_num_misses_per_model", "Number of cache misses per model", "cache_miss", "count"),
    ("nv_cache_miss_duration_per_model",
     "Total cache miss (insert+lookup) duration per model, in microseconds", "cache_miss", "us"),
)  # fmt: skip


def _model_cache_families(ids: list[tuple[ModelVersion, str]]) -> list[str]:
    """The per-model cache families, for the versions whose configuration enables the response
    cache: as Triton, at zero where the server has no cache."""
    cached = [(v, labels) for v, labels in ids if v.config.response_cache.enable]
    lines: list[str] = []
    for name, help_text, duration, unit in MODEL_CACHE_FAMILIES if cached else ():
        samples = []
        for v, labels in cached:
            total = getattr(v.statistics, duration)
            samples.append(f"{name}{labels} {total.count if unit == 'count' else total.ns // 1000}")
        lines.extend(family(name, "counter", help_text, samples))
    return lines


def render_cache_metrics(stats: CacheStatistics) -> str:
    """Triton's cache-wide families (gauges, no labels), from the cache's statistics."""
    values = (
        ("nv_cache_num_entries", "Number of responses stored in response cache", stats.entries),
        ("nv_cache_num_lookups", "Number of cache lookups in response cache", stats.lookups),
        ("nv_cache_num_hits", "Number of cache hits in response cache", stats.hits),
        ("nv_cache_num_misses", "Number of cache misses in response cache", stats.misses),
        ("nv_cache_num_evictions", "Number of cache evictions in response cache", stats.evictions),
        ("nv_cache_lookup_duration", "Total cache lookup duration (hit and miss), in microseconds",
         stats.lookup_ns // 1000),
        ("nv_cache_insertion_duration", "Total cache insertion duration, in microseconds",
         stats.insertion_ns // 1000),
        ("nv_cache_util", "Cache utilization [0.0 - 1.0]", stats.utilization),
    )  # fmt: skip
    lines = [line for name, help_text, value in values for line in family(name, "gauge", help_text,
             [f"{name} {_number(value)}"])]  # fmt: skip
    return "\n".join(lines) + "\n"


def _with_reason(labels: str, reason: str) -> str:
    """Labels with Triton's failure `reason` among them, before `version` as Triton orders them."""
    head, _, version = labels.rpartition(",version=")
    return f'{head},reason="{reason}",version={version}'


def render_latency_distributions(ids: list[tuple[ModelVersion, str]], latency: LatencyOptions) -> list[str]:
    """The summaries and histograms `--metrics-config` asks for."""
    lines: list[str] = []
    now = time.monotonic_ns()
    if latency.summaries:
        cached = [(v, labels) for v, labels in ids if v.scheduler is not None and v.scheduler.response_cache]
        for summaries, versions in ((SUMMARIES, ids), (CACHE_SUMMARIES, cached)):
            for name, help_text, kind, duration in summaries:
                samples = [
                    sample
                    for v, labels in versions
                    for sample in _summary(name, labels, v.statistics, kind, duration, now)
                ]
                if samples:
                    lines.extend(family(name, "summary", help_text, samples))
    if latency.histograms:
        samples = [
            sample
            for v, labels in ids
            if v.statistics.first_response is not None and v.signature.decoupled
            for sample in _first_response(labels, v.statistics)
        ]
        if samples:
            lines.extend(family(FIRST_RESPONSE_FAMILY, "histogram", FIRST_RESPONSE_HELP, samples))
        for name, help_text, kind, duration in OWN_HISTOGRAMS:
            samples = [
                sample for v, labels in ids for sample in _own_histogram(name, labels, v, kind, duration)
            ]
            if samples:
                lines.extend(family(name, "histogram", help_text, samples))
    return lines


def _summary(
    name: str, labels: str, s: ModelStatistics, kind: str, duration: str, now_ns: int
) -> Iterator[str]:
    if s.recent is None:
        return
    # _count and _sum cover every success since the start, as a Prometheus summary's do;
    # the quantiles cover the recent window.
    total = getattr(s, duration)
    yield f"{name}_count{labels} {total.count}"
    yield f"{name}_sum{labels} {total.ns // 1000}"
    inner = labels[1:-1]
    points = s.latency.quantiles
    for point, value in zip(points, s.quantiles(kind, points, now_ns), strict=True):
        yield f'{name}{{{inner},quantile="{point:g}"}} {_number(value)}'


def _first_response(labels: str, s: ModelStatistics) -> Iterator[str]:
    counts = s.first_response
    assert counts is not None
    name, inner = FIRST_RESPONSE_FAMILY, labels[1:-1]
    yield f"{name}_count{labels} {sum(counts)}"
    yield f"{name}_sum{labels} {_number(s.first_response_ms)}"
    running = 0
    for bound, count in zip([*s.latency.first_response_buckets_ms, math.inf], counts, strict=True):
        running += count
        le = "+Inf" if bound == math.inf else f"{bound:g}"
        yield f'{name}_bucket{{{inner},le="{le}"}} {running}'


def _own_histogram(name: str, labels: str, version: ModelVersion, kind: str, duration: str) -> Iterator[str]:
    s = version.statistics
    counts = s.histograms.get(kind)
    if counts is None:
        return
    inner = labels[1:-1]
    running = 0
    for bound, count in zip([*HISTOGRAM_BUCKETS_US, math.inf], counts, strict=True):
        running += count
        le = "+Inf" if bound == math.inf else f"{bound:g}"
        yield f'{name}_bucket{{{inner},le="{le}"}} {running}'
    yield f"{name}_count{labels} {running}"
    yield f"{name}_sum{labels} {getattr(s, duration).ns / 1000:.9g}"


class MetricsPeers(Protocol):
    """The workers of a server of several (`coreserve.server.workers`)."""

    async def metrics(self) -> str:
        """Every worker's metrics, added up."""


class MetricsReport:
    """The whole metrics text of one server, whether a port serves it or `coreserve.Server.metrics()` asks."""

    def __init__(
        self,
        repository: ModelRepository,
        *,
        latency: LatencyOptions | None = None,
        cpu: bool = True,
        gpu: bool = True,
        interval_ms: float = 2000.0,
        custom: CustomMetrics | None = None,
        response_cache: ResponseCache | None = None,
        traffic: TrafficRouter | None = None,
    ) -> None:
        self._repository = repository
        self._traffic = traffic
        self._response_cache = response_cache
        self._latency = latency or LatencyOptions()
        self._custom = custom or CustomMetrics()  # families the backends add (Triton's custom metrics)
        self._process = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self._process)
        PlatformCollector(registry=self._process)
        GCCollector(registry=self._process)
        self._system = SystemMetrics(cpu=cpu, gpu=gpu, interval_ms=interval_ms)
        self.peers: MetricsPeers | None = None  # in a worker of a server of several: all workers'

    def render(self, cache_statistics: CacheStatistics | None = None) -> str:
        """The metrics in Prometheus text format 0.0.4 (`cache_statistics`: asked here if None)."""
        cache = self._response_cache
        if cache is not None and cache_statistics is None:
            cache_statistics = cache.statistics()
        return (
            render_model_metrics(self._repository, self._latency)
            + render_traffic_metrics(self._repository, self._traffic)
            + self._custom.render()
            + (render_cache_metrics(cache_statistics) if cache_statistics is not None else "")
            + self._system.render()
            + generate_latest(self._process).decode()
        )

    async def render_on_loop(self) -> str:
        """`render`, for a frontend on the event loop: a cache that waits on another process
        (Redis) is asked for its statistics on its own executor, so a slow store holds up only
        the scrape, never the requests the loop serves."""
        cache = self._response_cache
        statistics = None
        if cache is not None and cache.executor is not None:
            statistics = await asyncio.get_running_loop().run_in_executor(cache.executor, cache.statistics)
        return self.render(statistics)

    async def server_text(self) -> str:
        """What the metrics port answers: `render_on_loop`, or in a server of several workers
        the metrics of every worker added up."""
        if self.peers is not None:
            return await self.peers.metrics()
        return await self.render_on_loop()

    def start(self) -> None:
        """Starts polling the CPU and GPU families (on the running event loop)."""
        self._system.start()

    async def stop(self) -> None:
        await self._system.stop()


class MetricsFrontend:
    """Serves a server's `MetricsReport` at `/metrics` on its own address and port."""

    def __init__(self, report: MetricsReport, *, address: str, port: int) -> None:
        self._report = report
        self._address = address
        self.port = port
        self._app = web.Application()
        self._app.router.add_get("/metrics", self._metrics)
        self._runner: web.AppRunner | None = None

    async def _metrics(self, request: web.Request) -> web.Response:
        text = await self._report.server_text()
        return web.Response(body=text.encode(), headers={"Content-Type": CONTENT_TYPE})

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
