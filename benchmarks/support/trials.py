"""How a benchmark's trials are ordered and summed up: the sides of a ratio take turns, and each
figure is a median, since the machines these run on are shared and their speed drifts."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from benchmarks.support.load_generators import Load


def rotated(paths: tuple[str, ...], round_index: int) -> tuple[str, ...]:
    """The order of a round's trials: `paths` rotated by the round's index, so that each path
    runs first, second, ... in turn and a neighbour slowing the machine weighs on all alike."""
    shift = round_index % len(paths)
    return paths[shift:] + paths[:shift]


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def median_load(loads: Sequence[Load]) -> Load:
    """The trial with the median throughput (its latencies belong to it)."""
    ordered = sorted(loads, key=lambda load: load.requests_per_s)
    return ordered[len(ordered) // 2]
