"""Which settings to measure: the bounds of the space, and the two ways through it.

`brute` measures every combination within the bounds. `quick` climbs from the model's current
settings: it measures the neighbours of the best settings so far (batch size doubled or halved,
dynamic batching switched, one instance more or fewer, the next queue delay) and moves to the
best of them while that improves the objective, so it measures a path, not the whole space.
Each settings is measured over client concurrencies 1, 2, 4, … until the throughput stops
growing or the latency budget is passed (`concurrency_levels`).
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

from coreserve.analyze._points import Measurement, ModelSettings
from coreserve.analyze._ranking import Constraints, rank

GROWTH = 1.05  # a concurrency level must add 5% throughput for the next to be measured

Evaluate = Callable[[ModelSettings], Awaitable[list[Measurement]]]


@dataclass(frozen=True)
class SearchSpace:
    """The bounds of the sweep (Model Analyzer's run-config-search options)."""

    max_batch_size: int = 16  # batch sizes 1, 2, 4, … up to this (a model without batching keeps 0)
    max_instance_count: int = 4
    queue_delays_us: tuple[int, ...] = (0,)
    max_concurrency: int = 64
    batching: bool = True  # False where the model has max_batch_size 0: batch settings stay as found

    def batch_sizes(self) -> list[int]:
        if not self.batching:
            return [0]
        sizes, size = [], 1
        while size <= self.max_batch_size:
            sizes.append(size)
            size *= 2
        return sizes

    def all_settings(self) -> list[ModelSettings]:
        found = []
        for batch, count in itertools.product(self.batch_sizes(), range(1, self.max_instance_count + 1)):
            found.append(ModelSettings(batch, False, count))
            if batch > 0:
                found.extend(ModelSettings(batch, True, count, delay) for delay in self.queue_delays_us)
        return sorted(set(found))

    def clamp(self, settings: ModelSettings) -> ModelSettings:
        """`settings` brought into the bounds (the climb starts from the model's own)."""
        sizes = self.batch_sizes()
        batch = max((size for size in sizes if size <= max(settings.max_batch_size, 1)), default=sizes[0])
        delay = min(self.queue_delays_us, key=lambda value: abs(value - settings.max_queue_delay_us))
        batching = settings.dynamic_batching and batch > 0
        count = min(max(settings.instance_count, 1), self.max_instance_count)
        return ModelSettings(batch, batching, count, delay if batching else 0)

    def neighbours(self, settings: ModelSettings) -> Iterator[ModelSettings]:
        sizes = self.batch_sizes()
        index = sizes.index(settings.max_batch_size)
        for step in (-1, 1):
            if 0 <= index + step < len(sizes) and sizes[index + step] > 0:
                yield self._with(settings, max_batch_size=sizes[index + step])
        if settings.max_batch_size > 0:
            if settings.dynamic_batching:
                yield ModelSettings(settings.max_batch_size, False, settings.instance_count)
                position = self.queue_delays_us.index(settings.max_queue_delay_us)
                for step in (-1, 1):
                    if 0 <= position + step < len(self.queue_delays_us):
                        yield self._with(settings, max_queue_delay_us=self.queue_delays_us[position + step])
            else:
                yield ModelSettings(
                    settings.max_batch_size, True, settings.instance_count, self.queue_delays_us[0]
                )
        for step in (-1, 1):
            if 1 <= settings.instance_count + step <= self.max_instance_count:
                yield self._with(settings, instance_count=settings.instance_count + step)

    @staticmethod
    def _with(settings: ModelSettings, **changes: int) -> ModelSettings:
        values = {
            "max_batch_size": settings.max_batch_size,
            "dynamic_batching": settings.dynamic_batching,
            "instance_count": settings.instance_count,
            "max_queue_delay_us": settings.max_queue_delay_us,
        }
        values.update(changes)
        return ModelSettings(**values)  # type: ignore[arg-type]


def concurrency_levels(space: SearchSpace) -> Iterator[int]:
    level = 1
    while level <= space.max_concurrency:
        yield level
        level *= 2


def keep_going(measured: list[Measurement], constraints: Constraints) -> bool:
    """Whether the next concurrency level is worth measuring after `measured` (in order)."""
    last = measured[-1]
    if last.failed:
        return False
    if constraints.latency_budget_ms is not None and last.p99_ms > constraints.latency_budget_ms:
        return False  # more clients only queue longer
    if len(measured) >= 2:
        best_before = max(point.throughput for point in measured[:-1])
        return last.throughput >= best_before * GROWTH
    return True


async def brute(space: SearchSpace, evaluate: Evaluate, done: frozenset[ModelSettings] = frozenset()) -> None:
    """Every settings within the bounds, but those in `done`."""
    for settings in space.all_settings():
        if settings not in done:
            await evaluate(settings)


async def quick(
    space: SearchSpace, start: ModelSettings, evaluate: Evaluate, constraints: Constraints, objective: str
) -> None:
    """Hill climb from `start` (brought into the bounds) while a neighbour does better."""
    measured: dict[ModelSettings, list[Measurement]] = {}

    async def points(settings: ModelSettings) -> list[Measurement]:
        if settings not in measured:
            measured[settings] = await evaluate(settings)
        return measured[settings]

    current = space.clamp(start)
    await points(current)
    while True:
        for neighbour in space.neighbours(current):
            await points(neighbour)
        everything = [point for found in measured.values() for point in found]
        ranking = rank(everything, constraints, objective)
        leaders = ranking.passing or ranking.closest
        if not leaders or leaders[0].settings == current:
            return
        current = leaders[0].settings
