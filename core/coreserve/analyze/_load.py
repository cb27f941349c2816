"""One load level measured: `concurrency` clients sending requests back to back (gRPC or
HTTP: see `_callers`).

perf_analyzer's way: measurement windows of a fixed length, repeated until the last three
agree within 10% on throughput and on p99 latency (or a window limit is reached), and the
figures are those of the three stable windows. Latencies are the client's; the split of a
request's time comes from the server's statistics over the same windows; CPU and memory from
the server's process tree where it is a local process. The generator's own CPU is measured
too: near one core, the client, not the server, set the pace.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from coreserve.analyze._callers import Caller, RequestFailed
from coreserve.analyze._client import ServerClient, ServerGone, StatsSnapshot
from coreserve.analyze._points import Measurement, ModelSettings
from coreserve.analyze._server_process import Usage

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
    seconds: float

    @property
    def throughput(self) -> float:
        return self.completed / self.seconds if self.seconds > 0 else 0.0

    @property
    def p99_s(self) -> float:
        return float(np.percentile(self.latencies_s, 99)) if self.latencies_s else 0.0


class _Recorder:
    """What the clients completed since the window began."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.errors = 0
        self.first_error = ""

    def take(self) -> tuple[list[float], int]:
        latencies, errors = self.latencies, self.errors
        self.latencies, self.errors = [], 0
        return latencies, errors


async def measure(
    client: ServerClient,
    caller: Caller,
    model: str,
    settings: ModelSettings,
    concurrency: int,
    windows: Windows,
    usage: Callable[[], Usage] | None = None,
    batch: int = 1,
) -> Measurement:
    """Measures one load level of `caller`'s requests (each of `batch` inferences) on `model`;
    raises ServerGone when the server stops answering."""
    recorder = _Recorder()
    stop = asyncio.Event()
    workers = [asyncio.create_task(_client_loop(caller, recorder, stop)) for _ in range(concurrency)]
    try:
        await asyncio.sleep(windows.warmup_seconds)
        recorder.take()
        measured = await _stable_windows(client, model, recorder, windows, usage)
    finally:
        stop.set()
        ended = await asyncio.gather(*workers, return_exceptions=True)
    for outcome in ended:
        if isinstance(outcome, ServerGone):
            raise outcome
    stable, before, after, usage_before, usage_after, client_cpu = measured
    latencies = np.array([value for window in stable for value in window.latencies_s]) * 1e3
    seconds = sum(window.seconds for window in stable)
    completed = sum(window.completed for window in stable)
    errors = sum(window.errors for window in stable)
    point = Measurement(settings=settings, concurrency=concurrency, requests=completed, errors=errors)
    if completed == 0:
        point.error = f"every request failed: {recorder.first_error or 'no answer'}"
        return point
    point.throughput = completed * batch / seconds
    point.p50_ms, point.p95_ms, point.p99_ms = (float(v) for v in np.percentile(latencies, [50, 95, 99]))
    point.avg_ms = float(latencies.mean())
    split = after.per_request_ms(before)
    point.queue_ms, point.compute_input_ms, point.compute_infer_ms, point.compute_output_ms = split
    point.client_cpu_percent = 100 * client_cpu / seconds
    if usage_before is not None and usage_after is not None:
        elapsed = usage_after.at - usage_before.at
        point.server_cpu_percent = (
            100 * (usage_after.cpu_s - usage_before.cpu_s) / elapsed if elapsed else 0.0
        )
        point.server_rss_mb = usage_after.rss_mb
    if errors:
        point.extra["first_error"] = recorder.first_error
    return point


async def _stable_windows(
    client: ServerClient,
    model: str,
    recorder: _Recorder,
    windows: Windows,
    usage: Callable[[], Usage] | None,
) -> tuple[list[_Window], StatsSnapshot, StatsSnapshot, Usage | None, Usage | None, float]:
    """Windows until the last three agree; returns them with the statistics and usage around them."""
    history: list[tuple[_Window, StatsSnapshot, Usage | None, float]] = []
    snapshot = await client.statistics(model)
    current_usage = usage() if usage else None
    cpu = time.process_time()
    while True:
        started = time.perf_counter()
        await asyncio.sleep(windows.seconds)
        latencies, errors = recorder.take()
        window = _Window(len(latencies), errors, latencies, time.perf_counter() - started)
        history.append((window, snapshot, current_usage, cpu))
        snapshot = await client.statistics(model)
        current_usage = usage() if usage else None
        cpu = time.process_time()
        recent = history[-STABLE_WINDOWS:]
        if len(recent) == STABLE_WINDOWS and _stable([item[0] for item in recent]):
            break
        if len(history) >= windows.max_windows:
            recent = history[-STABLE_WINDOWS:]
            break
    first = recent[0]
    return ([item[0] for item in recent], first[1], snapshot, first[2], current_usage, cpu - first[3])


def _stable(group: list[_Window]) -> bool:
    """perf_analyzer's rule: throughput and p99 latency each within 10% of their mean."""
    for values in ([window.throughput for window in group], [window.p99_s for window in group]):
        mean = sum(values) / len(values)
        if mean == 0 or any(abs(v - mean) > STABLE_WITHIN * mean for v in values):
            return False
    return True


async def _client_loop(caller: Caller, recorder: _Recorder, stop: asyncio.Event) -> None:
    while not stop.is_set():
        started = time.perf_counter()
        try:
            await caller()
        except RequestFailed as exc:
            recorder.errors += 1
            recorder.first_error = recorder.first_error or str(exc)
            await asyncio.sleep(0.01)  # a failing model answers at once: do not spin on it
            continue
        recorder.latencies.append(time.perf_counter() - started)
