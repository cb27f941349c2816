"""One load level measured: `concurrency` clients sending requests back to back (gRPC or
HTTP: see `_callers`).

perf_analyzer's way: measurement windows of a fixed length, repeated until the last three
agree within 10% on throughput and on p99 latency (or a window limit is reached), and the
figures are those of the three stable windows. Latencies are the client's; the split of a
request's time comes from the server's statistics over the same windows; CPU and memory from
the server's process tree where it is a local process; the GPUs' from the server's metrics.
The generator's own CPU is measured too: near one core, the client, not the server, set the pace.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from coreserve.analyze._points import Measurement, ModelSettings
from coreserve.analyze.measure._callers import Caller, RequestFailed
from coreserve.analyze.measure._client import ServerClient, ServerGone, StatsSnapshot
from coreserve.analyze.measure._gpu_metrics import GpuMetrics
from coreserve.analyze.measure._server_process import Usage

STABLE_WINDOWS = 3
STABLE_WITHIN = 0.10


@dataclass(frozen=True)
class Windows:
    """How long each measurement window is, and how many a load level may take at most."""

    seconds: float = 1.0
    max_windows: int = 10
    warmup_seconds: float = 0.5


@dataclass
class _Window:
    completed: int
    errors: int
    latencies_s: list[float]
    began: float  # time.monotonic()
    ended: float

    @property
    def seconds(self) -> float:
        return self.ended - self.began

    @property
    def throughput(self) -> float:
        return self.completed / self.seconds if self.seconds > 0 else 0.0

    @property
    def p99_s(self) -> float:
        return float(np.percentile(self.latencies_s, 99)) if self.latencies_s else 0.0


class _Recorder:
    """What the clients completed since the window began, and why the load had to stop."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.errors = 0
        self.first_error = ""
        self.gone: ServerGone | None = None

    def failed(self, reason: str) -> None:
        self.errors += 1
        self.first_error = self.first_error or reason

    def take(self) -> tuple[list[float], int]:
        latencies, errors = self.latencies, self.errors
        self.latencies, self.errors = [], 0
        return latencies, errors


@dataclass
class _Span:
    """The stable windows and what the server and this process used over them."""

    windows: list[_Window]
    stable: bool
    stats_before: StatsSnapshot
    stats_after: StatsSnapshot
    usage_before: Usage | None
    usage_after: Usage | None
    client_cpu_s: float


async def measure(
    client: ServerClient,
    caller: Caller,
    model: str,
    settings: ModelSettings,
    concurrency: int,
    windows: Windows,
    usage: Callable[[], Usage] | None = None,
    batch: int = 1,
    gpus: GpuMetrics | None = None,
) -> Measurement:
    """Measures one load level of `caller`'s requests (each of `batch` inferences) on `model`;
    raises ServerGone when the server stops answering."""
    recorder = _Recorder()
    workers = [asyncio.create_task(_client_loop(caller, recorder)) for _ in range(concurrency)]
    try:
        await asyncio.sleep(windows.warmup_seconds)
        span = await _stable_windows(client, model, recorder, windows, usage)
    finally:
        for worker in workers:  # requests in flight are dropped, not waited for
            worker.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    point = _point(span, recorder, settings, concurrency, batch)
    if gpus is not None and not point.failed:
        figures = gpus.figures(span.windows[0].began, span.windows[-1].ended)
        if figures is not None:
            point.gpu_utilization_percent = figures.utilization_percent
            point.gpu_memory_mb = figures.memory_used_mb
    return point


def _point(
    span: _Span, recorder: _Recorder, settings: ModelSettings, concurrency: int, batch: int
) -> Measurement:
    latencies = np.array([value for window in span.windows for value in window.latencies_s]) * 1e3
    seconds = sum(window.seconds for window in span.windows)
    completed = sum(window.completed for window in span.windows)
    errors = sum(window.errors for window in span.windows)
    point = Measurement(settings=settings, concurrency=concurrency, requests=completed, errors=errors)
    if not span.stable:
        point.extra["stable"] = False
    if errors:
        point.extra["first_error"] = recorder.first_error
    if completed == 0:
        point.error = f"every request failed: {recorder.first_error or 'no answer'}"
        return point
    point.throughput = completed * batch / seconds
    point.p50_ms, point.p95_ms, point.p99_ms = (float(v) for v in np.percentile(latencies, [50, 95, 99]))
    point.avg_ms = float(latencies.mean())
    split = span.stats_after.per_request_ms(span.stats_before)
    point.queue_ms, point.compute_input_ms, point.compute_infer_ms, point.compute_output_ms = split
    point.client_cpu_percent = 100 * span.client_cpu_s / seconds
    if span.usage_before is not None and span.usage_after is not None:
        point.server_cpu_percent = span.usage_after.cpu_percent_since(span.usage_before)
        point.server_rss_mb = span.usage_after.rss_mb
    return point


async def _stable_windows(
    client: ServerClient,
    model: str,
    recorder: _Recorder,
    windows: Windows,
    usage: Callable[[], Usage] | None,
) -> _Span:
    """Windows until the last three agree (or the limit is reached: the last three, not stable).

    The windows follow each other with no gap: each ends where the next begins, and what the
    statistics and /proc readings between them take is counted in the next one.
    """
    history: list[tuple[_Window, StatsSnapshot, Usage | None, float]] = []
    snapshot = await client.statistics(model)
    current_usage = await asyncio.to_thread(usage) if usage else None
    cpu = time.process_time()
    recorder.take()
    began = time.monotonic()
    while True:
        await asyncio.sleep(windows.seconds)
        if recorder.gone is not None:
            raise recorder.gone
        ended = time.monotonic()
        latencies, errors = recorder.take()
        window = _Window(len(latencies), errors, latencies, began, ended)
        history.append((window, snapshot, current_usage, cpu))
        began = ended
        snapshot = await client.statistics(model)
        current_usage = await asyncio.to_thread(usage) if usage else None
        cpu = time.process_time()
        recent = history[-STABLE_WINDOWS:]
        stable = len(recent) == STABLE_WINDOWS and _stable([item[0] for item in recent])
        if stable or len(history) >= windows.max_windows:
            first = recent[0]
            return _Span(
                [item[0] for item in recent],
                stable,
                first[1],
                snapshot,
                first[2],
                current_usage,
                cpu - first[3],
            )


def _stable(group: list[_Window]) -> bool:
    """perf_analyzer's rule: throughput and p99 latency each within 10% of their mean."""
    for values in ([window.throughput for window in group], [window.p99_s for window in group]):
        mean = sum(values) / len(values)
        if mean == 0 or any(abs(v - mean) > STABLE_WITHIN * mean for v in values):
            return False
    return True


async def _client_loop(caller: Caller, recorder: _Recorder) -> None:
    """Sends requests back to back until cancelled; a failed request is counted, not fatal."""
    while recorder.gone is None:
        started = time.perf_counter()
        try:
            await caller()
        except ServerGone as exc:
            recorder.gone = exc
            return
        except RequestFailed as exc:
            recorder.failed(str(exc))
        except Exception as exc:  # a client-side fault (a broken connection's answer): counted, named
            recorder.failed(f"{type(exc).__name__}: {exc}")
        else:
            recorder.latencies.append(time.perf_counter() - started)
            continue
        await asyncio.sleep(0.01)  # a failing request answers at once: do not spin on it
