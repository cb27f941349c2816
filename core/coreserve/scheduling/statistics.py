"""Per model-version statistics: what Triton's statistics extension and metrics report.

Recording is a handful of integer additions per request, done by the scheduler after each
execution; everything else (the JSON shape, Prometheus families, quantiles) is computed when
someone asks, off the request path.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from coreserve.backend.responder import Responder
from coreserve.types import InferenceRequest

FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
LATENCY_KINDS = ("request", "queue", "compute_input", "compute_infer", "compute_output")
# Upper bounds (microseconds) of the latency histogram buckets.
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
    """Which per-request latency distributions to keep (the metrics' summaries and histograms)."""

    summaries: bool = True
    histograms: bool = False
    window: int = 4096


class ModelStatistics:
    """Cumulative statistics of one model version."""

    def __init__(self, model_name: str, version: int, latency: LatencyOptions | None = None) -> None:
        self.model_name = model_name
        self.version = str(version)
        self.latency = latency or LatencyOptions()
        self.success = Duration()
        self.fail = Duration()
        self.queue = Duration()
        self.compute_input = Duration()
        self.compute_infer = Duration()
        self.compute_output = Duration()
        self.failures = dict.fromkeys(FAILURE_REASONS, 0)
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0
        self.batches: dict[int, BatchDurations] = {}
        self.recent: dict[str, deque[int]] = (
            {kind: deque(maxlen=self.latency.window) for kind in LATENCY_KINDS}
            if self.latency.summaries
            else {}
        )
        self.histograms: dict[str, list[int]] = (
            {kind: [0] * (len(HISTOGRAM_BUCKETS_US) + 1) for kind in ("request", "queue")}
            if self.latency.histograms
            else {}
        )

    def record_execution(
        self, requests: Sequence[InferenceRequest], responder: Responder, end_ns: int
    ) -> None:
        """Records one execution of a batch and the outcome of each of its requests."""
        start = responder.compute_start_ns
        inputs_ready = responder.inputs_ready_ns or start
        infer_done = responder.infer_done_ns or end_ns
        input_ns, infer_ns, output_ns = inputs_ready - start, infer_done - inputs_ready, end_ns - infer_done
        self.execution_count += 1
        self.last_inference_ms = time.time_ns() // 1_000_000
        batch_size = 0
        for request in requests:
            total_ns = end_ns - request.received_ns
            if request.cancelled or responder.failed(request):
                self.fail.add(total_ns)
                self.failures["CANCELED" if request.cancelled else "BACKEND"] += 1
                continue
            queue_ns = start - request.queued_ns
            batch_size += request.batch_size
            self.inference_count += request.batch_size
            self.success.add(total_ns)
            self.queue.add(queue_ns)
            self.compute_input.add(input_ns)
            self.compute_infer.add(infer_ns)
            self.compute_output.add(output_ns)
            if self.recent:
                self._observe(total_ns, queue_ns, input_ns, infer_ns, output_ns)
            if self.histograms:
                self._bucket("request", total_ns)
                self._bucket("queue", queue_ns)
        if batch_size:
            durations = self.batches.get(batch_size)
            if durations is None:
                durations = self.batches[batch_size] = BatchDurations()
            durations.compute_input.add(input_ns)
            durations.compute_infer.add(infer_ns)
            durations.compute_output.add(output_ns)

    def record_failure(self, request: InferenceRequest, reason: str) -> None:
        """Records a request that failed before it executed (invalid, rejected, cancelled)."""
        self.fail.add(time.monotonic_ns() - request.received_ns)
        self.failures[reason] += 1

    def _observe(self, *values: int) -> None:
        for kind, value in zip(LATENCY_KINDS, values, strict=True):
            self.recent[kind].append(value)

    def _bucket(self, kind: str, ns: int) -> None:
        self.histograms[kind][bisect.bisect_left(HISTOGRAM_BUCKETS_US, ns / 1000)] += 1

    def quantiles(self, kind: str, points: Sequence[float]) -> list[float]:
        """Quantiles (in microseconds) of the recent observations of one latency kind."""
        values = sorted(self.recent.get(kind, ()))
        if not values:
            return [0.0 for _ in points]
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
                "cache_hit": Duration().as_dict(),
                "cache_miss": Duration().as_dict(),
            },
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
