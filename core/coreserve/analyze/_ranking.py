"""Which settings win: the user's constraints, and the objective that orders what meets them.

Each settings is represented by its best load level that meets every constraint (Model
Analyzer does the same: a configuration is as good as its best passing measurement). Settings
with no passing level are kept apart, nearest first, so a budget nothing meets still says
which configurations came closest.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from coreserve.analyze._points import Measurement, ModelSettings


@dataclass(frozen=True)
class Constraints:
    """Model Analyzer's constraints: p99 latency, minimum throughput, server memory, GPU memory."""

    latency_budget_ms: float | None = None
    min_throughput: float | None = None
    max_memory_mb: float | None = None
    max_gpu_memory_mb: float | None = None

    def violations(self, point: Measurement) -> list[str]:
        """What `point` breaks, in words; empty where it meets every constraint."""
        if point.failed:
            return [point.error]
        broken = []
        if point.errors:  # answered fast, counted nowhere: a level that fails requests is no answer
            broken.append(f"{point.errors} of {point.requests + point.errors} requests failed")
        if self.latency_budget_ms is not None and point.p99_ms > self.latency_budget_ms:
            broken.append(f"p99 {point.p99_ms:.1f} ms > budget {self.latency_budget_ms:g} ms")
        if self.min_throughput is not None and point.throughput < self.min_throughput:
            broken.append(f"throughput {point.throughput:.0f}/s < minimum {self.min_throughput:g}/s")
        memory = point.server_rss_mb
        if self.max_memory_mb is not None and memory is not None and memory > self.max_memory_mb:
            broken.append(f"memory {memory:.0f} MB > maximum {self.max_memory_mb:g} MB")
        gpu_memory, gpu_bound = point.gpu_memory_mb, self.max_gpu_memory_mb
        if gpu_bound is not None and gpu_memory is not None and gpu_memory > gpu_bound:
            broken.append(f"GPU memory {gpu_memory:.0f} MB > maximum {gpu_bound:g} MB")
        return broken

    def met_by(self, point: Measurement) -> bool:
        return not self.violations(point)


@dataclass
class Ranking:
    """Settings ordered best first: those that meet the constraints, then the nearest misses."""

    passing: list[Measurement] = field(default_factory=list)  # one per settings, best first
    closest: list[Measurement] = field(default_factory=list)  # where none passes: nearest first


def rank(points: Iterable[Measurement], constraints: Constraints, objective: str = "throughput") -> Ranking:
    """`objective` "throughput" (highest first) or "latency" (lowest p99 first)."""
    by_settings: dict[ModelSettings, list[Measurement]] = {}
    for point in points:
        by_settings.setdefault(point.settings, []).append(point)
    passing, missing = [], []
    for measured in by_settings.values():
        good = [point for point in measured if constraints.met_by(point)]
        if good:
            passing.append(max(good, key=lambda point: _score(point, objective)))
        else:
            usable = [point for point in measured if not point.failed]
            if usable:
                missing.append(min(usable, key=lambda point: _distance(point, constraints)))
    passing.sort(key=lambda point: _score(point, objective), reverse=True)
    missing.sort(key=lambda point: _distance(point, constraints))
    return Ranking(passing=passing, closest=missing)


def _score(point: Measurement, objective: str) -> tuple[float, float]:
    if objective == "latency":
        return (-point.p99_ms, point.throughput)
    return (point.throughput, -point.p99_ms)


def _distance(point: Measurement, constraints: Constraints) -> float:
    """How far `point` is from meeting the constraints, as a sum of relative overshoots."""
    distance = 0.0
    if constraints.latency_budget_ms:
        distance += max(0.0, point.p99_ms / constraints.latency_budget_ms - 1)
    if constraints.min_throughput:
        distance += max(0.0, 1 - point.throughput / constraints.min_throughput)
    if constraints.max_memory_mb:
        distance += max(0.0, (point.server_rss_mb or 0.0) / constraints.max_memory_mb - 1)
    if constraints.max_gpu_memory_mb:
        distance += max(0.0, (point.gpu_memory_mb or 0.0) / constraints.max_gpu_memory_mb - 1)
    return distance
