"""Per model-version statistics: what Triton's statistics extension and metrics report.

Recording is a handful of integer additions per request, done by the scheduler after each
execution; everything else (the JSON shape, Prometheus families, quantiles) is computed when
someone asks, off the request path.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, NamedTuple

from coreserve.backend.responder import Responder
from coreserve.types import InferenceRequest

if TYPE_CHECKING:
    from coreserve.protos.model_config_pb2 import ModelConfig

FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
# The per-request latencies a summary window keeps, in the order of its tuples (after end_ns).
LATENCY_KINDS = ("request", "queue", "compute_input", "compute_infer", "compute_output")
CACHE_KINDS = ("cache_hit", "cache_miss")
# Triton's default summary quantiles (`--metrics-config summary_quantiles`).
DEFAULT_QUANTILES = (0.5, 0.9, 0.95, 0.99, 0.999)
# Triton's default buckets (milliseconds) of its first-response histogram.
FIRST_RESPONSE_FAMILY = "nv_inference_first_response_histogram_ms"
FIRST_RESPONSE_BUCKETS_MS = (100.0, 500.0, 2000.0, 5000.0)
# Upper bounds (microseconds) of coreserve's own request and queue latency histograms.
HISTOGRAM_BUCKETS_US = (
    100,
    250,
    500,
    1_000,
    2_500,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
)


@dataclass(slots=True)
class Duration:
    """A count of events and their total duration in nanoseconds."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int) -> None:
        self.count += 1
        self.ns += ns

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass(slots=True)
class BatchDurations:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass(frozen=True)
class LatencyOptions:
    """Which latency families to keep: `--metrics-config` and a model's `model_metrics`.

    The cumulative durations are always kept (the statistics extension reports them);
    `counters` only says whether /metrics shows them.
    """

    counters: bool = True  # counter_latencies
    summaries: bool = False  # summary_latencies
    histograms: bool = False  # histogram_latencies
    quantiles: tuple[float, ...] = DEFAULT_QUANTILES  # summary_quantiles
    # A summary's quantiles cover the successes of the last `max_age_s` seconds (the
    # Prometheus client libraries' default, which Triton keeps), at most the last `window`.
    max_age_s: float = 60.0
    window: int = 4096
    first_response_buckets_ms: tuple[float, ...] = FIRST_RESPONSE_BUCKETS_MS

    def for_config(self, config: ModelConfig) -> LatencyOptions:
        """These options with the histogram buckets a model's `model_metrics` sets."""
        for control in config.model_metrics.metric_control:
            if control.metric_identifier.family == FIRST_RESPONSE_FAMILY and control.HasField(
                "histogram_options"
            ):
                buckets = tuple(sorted(set(control.histogram_options.buckets)))
                return replace(self, first_response_buckets_ms=buckets)
        return self


class ExecutionTiming(NamedTuple):
    """When one execution of a batch started and how long its phases took (nanoseconds)."""

    start_ns: int
    input_ns: int
    infer_ns: int
    output_ns: int
    end_ns: int


class ModelStatistics:
    """Cumulative statistics of one model version."""

    def __init__(
        self, model_name: str, version: int, latency: LatencyOptions | None = None, ensemble: bool = False
    ) -> None:
        self.model_name = model_name
        # An ensemble's, counted as Triton counts them: a failure's reason is OTHER (its steps'
        # are theirs), and an execution whose every request failed is none.
        self.ensemble = ensemble
        self.version = str(version)
        self.latency = latency or LatencyOptions()
        self.success = Duration()
        self.fail = Duration()
        self.queue = Duration()
        self.compute_input = Duration()
        self.compute_infer = Duration()
        self.compute_output = Duration()
        self.cache_hit = Duration()  # lookup and answer of each response cache hit
        self.cache_miss = Duration()  # lookup and insertion of each miss
        self.failures = dict.fromkeys(FAILURE_REASONS, 0)
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0
        self.batches: dict[int, BatchDurations] = {}
        # (end_ns, request, queue, compute input, infer, output ns) of recent successes.
        self.recent: deque[tuple[int, int, int, int, int, int]] | None = (
            deque(maxlen=self.latency.window) if self.latency.summaries else None
        )
        # (end_ns, hit ns, miss ns) of recent response cache lookups (-1: not that kind).
        self.recent_cache: deque[tuple[int, int, int]] | None = (
            deque(maxlen=self.latency.window) if self.latency.summaries else None
        )
        self.histograms: dict[str, list[int]] = (
            {kind: [0] * (len(HISTOGRAM_BUCKETS_US) + 1) for kind in ("request", "queue")}
            if self.latency.histograms
            else {}
        )
        # Triton's first-response histogram (decoupled models): bucket counts and sum in ms.
        self.first_response: list[int] | None = (
            [0] * (len(self.latency.first_response_buckets_ms) + 1) if self.latency.histograms else None
        )
        self.first_response_ms = 0.0

    def record_execution(
        self, requests: Sequence[InferenceRequest], responder: Responder, end_ns: int
    ) -> ExecutionTiming:
        """Records one execution of a batch and the outcome of each request it settled.

        A request still open (a decoupled model answers it after execute returned) or handed
        back for rescheduling is not settled yet: its caller records it later with
        `record_outcome` and the timing returned here. One handed back unstarted (requeued)
        is not part of this execution.
        """
        start = responder.compute_start_ns
        inputs_ready = responder.inputs_ready_ns or start
        infer_done = responder.infer_done_ns or end_ns
        timing = ExecutionTiming(
            start, inputs_ready - start, infer_done - inputs_ready, end_ns - infer_done, end_ns
        )
        self.last_inference_ms = time.time_ns() // 1_000_000
        rescheduled = {id(request) for request in responder.rescheduled}
        requeued = {id(request) for request, _ in responder.requeued} if responder.requeued else ()
        batch_size = 0
        for request in requests:
            if id(request) in requeued:
                continue  # never started: it runs (and counts) in a later execution
            if responder.is_open(request) or id(request) in rescheduled:
                if not request.is_cancelled():
                    batch_size += request.batch_size
                continue
            cancelled = request.is_cancelled()
            reason = "CANCELED" if cancelled else "BACKEND" if responder.failed(request) else None
            self.record_outcome(request, timing, reason)
            if reason is None:
                batch_size += request.batch_size
        if batch_size or not self.ensemble:
            self.execution_count += 1
        if batch_size:
            durations = self.batches.get(batch_size)
            if durations is None:
                durations = self.batches[batch_size] = BatchDurations()
            # (an ensemble's execution is one request: its phases are that request's)
            input_ns, infer_ns, output_ns = _phases(requests[0], timing)
            durations.compute_input.add(input_ns)
            durations.compute_infer.add(infer_ns)
            durations.compute_output.add(output_ns)
        return timing

    def record_outcome(self, request: InferenceRequest, timing: ExecutionTiming, reason: str | None) -> None:
        """Records how an executed request ended: a success (`reason` None) or a failure."""
        total_ns = timing.end_ns - request.received_ns
        if reason == "BACKEND" and self.ensemble:
            reason = "OTHER"
        if reason is not None:
            self.fail.add(total_ns)
            self.failures[reason] += 1
            return
        queue_ns = timing.start_ns - request.queued_ns
        input_ns, infer_ns, output_ns = _phases(request, timing)
        if request.counts_into is not None:  # a step of an ensemble's request
            request.counts_into.add(input_ns, infer_ns, output_ns)
        self.inference_count += request.batch_size
        self.success.add(total_ns)
        self.queue.add(queue_ns)
        self.compute_input.add(input_ns)
        self.compute_infer.add(infer_ns)
        self.compute_output.add(output_ns)
        if self.recent is not None:
            self.recent.append((timing.end_ns, total_ns, queue_ns, input_ns, infer_ns, output_ns))
        if self.histograms:
            self._bucket("request", total_ns)
            self._bucket("queue", queue_ns)

    def record_cache_hit(self, request: InferenceRequest, lookup_start_ns: int, end_ns: int) -> None:
        """Records a request answered from the response cache: a success, never an execution."""
        self.last_inference_ms = time.time_ns() // 1_000_000
        total_ns, queue_ns = end_ns - request.received_ns, lookup_start_ns - request.queued_ns
        self.success.add(total_ns)
        self.queue.add(queue_ns)  # Triton counts hits in the queue too
        self.cache_hit.add(end_ns - lookup_start_ns)
        if self.recent_cache is not None:
            self.recent_cache.append((end_ns, end_ns - lookup_start_ns, -1))
        # The request and queue summaries include cached requests, the compute ones do not (-1).
        if self.recent is not None:
            self.recent.append((end_ns, total_ns, queue_ns, -1, -1, -1))
        if self.histograms:
            self._bucket("request", total_ns)
            self._bucket("queue", queue_ns)

    def record_cache_miss(self, ns: int) -> None:
        """Records a response cache miss and the time its lookup and insertion took."""
        self.cache_miss.add(ns)
        if self.recent_cache is not None:
            self.recent_cache.append((time.monotonic_ns(), -1, ns))

    def record_failure(self, request: InferenceRequest, reason: str) -> None:
        """Records a request that failed before it executed (invalid, rejected, cancelled)."""
        self.fail.add(time.monotonic_ns() - request.received_ns)
        self.failures[reason] += 1

    def record_first_response(self, ns: int) -> None:
        """Records the time from a request's arrival to its first response (decoupled models)."""
        if self.first_response is None:
            return
        ms = ns / 1_000_000
        self.first_response[bisect.bisect_left(self.latency.first_response_buckets_ms, ms)] += 1
        self.first_response_ms += ms

    def _bucket(self, kind: str, ns: int) -> None:
        self.histograms[kind][bisect.bisect_left(HISTOGRAM_BUCKETS_US, ns / 1000)] += 1

    def quantiles(self, kind: str, points: Sequence[float], now_ns: int) -> list[float]:
        """Quantiles (microseconds) of one latency kind over the summary window; NaN if empty."""
        oldest = now_ns - int(self.latency.max_age_s * 1e9)
        recent: Iterable[tuple[int, ...]]
        if kind in CACHE_KINDS:
            recent, column = self.recent_cache or (), CACHE_KINDS.index(kind) + 1
        else:
            recent, column = self.recent or (), LATENCY_KINDS.index(kind) + 1
        values = sorted(entry[column] for entry in recent if entry[0] >= oldest and entry[column] >= 0)
        if not values:
            return [float("nan") for _ in points]
        last = len(values) - 1
        return [values[min(last, round(point * last))] / 1000 for point in points]

    def as_dict(self) -> dict[str, Any]:
        """The statistics in the shape of Triton's statistics extension."""
        return {
            "name": self.model_name,
            "version": self.version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.as_dict(),
                "fail": self.fail.as_dict(),
                "queue": self.queue.as_dict(),
                "compute_input": self.compute_input.as_dict(),
                "compute_infer": self.compute_infer.as_dict(),
                "compute_output": self.compute_output.as_dict(),
                "cache_hit": self.cache_hit.as_dict(),
                "cache_miss": self.cache_miss.as_dict(),
            },
            "response_stats": {},  # as Triton's Python backend leaves it (its other backends fill it)
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": durations.compute_input.as_dict(),
                    "compute_infer": durations.compute_infer.as_dict(),
                    "compute_output": durations.compute_output.as_dict(),
                }
                for size, durations in sorted(self.batches.items())
            ],
            "memory_usage": [],
        }


def _phases(request: InferenceRequest, timing: ExecutionTiming) -> tuple[int, int, int]:
    """A request's compute input, infer and output ns: its execution's, or for an ensemble's
    request the sums of its steps' (Triton's ensemble statistics)."""
    sums = request.compute_sums
    if sums is None:
        return timing.input_ns, timing.infer_ns, timing.output_ns
    return sums.input_ns, sums.infer_ns, sums.output_ns
