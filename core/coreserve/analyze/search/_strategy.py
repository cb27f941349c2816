"""Which settings to measure: the bounds of the space, and the two ways through it.

`brute` measures every combination within the bounds. `quick` climbs from the model's current
settings one axis at a time (dynamic batching switched, the batch size doubled or halved while
dynamic batching is on, the next queue delay, the instances' kind where the server has GPUs,
one instance more or fewer) while a step improves
the objective, so it measures a path through the space, not the whole of it. The load
generator sends batch-1 requests, so without dynamic batching every max_batch_size behaves the
same, and with it a size of 1 forms no batch: the climb does not measure those steps (brute
measures every combination all the same).
Each settings is measured over client concurrencies 1, 2, 4, … until the throughput stops
growing or the latency budget is passed (`concurrency_levels`).
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, replace

from coreserve.analyze._points import Measurement, ModelSettings
from coreserve.analyze._ranking import Constraints, rank

GROWTH = 1.05  # a concurrency level must add 5% throughput for the next to be measured
# Dynamic batching first: with the load generator's batch-1 requests, max_batch_size matters
# only once the server may form batches itself.
OWN_AXES = ("dynamic_batching", "batch", "queue_delay", "kind", "instances")
MAX_PASSES = 3

Evaluate = Callable[[ModelSettings], Awaitable[list[Measurement]]]


@dataclass(frozen=True)
class SearchSpace:
    """The bounds of the sweep (Model Analyzer's run-config-search options)."""

    max_batch_size: int = 16  # batch sizes 1, 2, 4, … up to this (a model without batching keeps 0)
    max_instance_count: int = 4
    queue_delays_us: tuple[int, ...] = (0,)
    max_concurrency: int = 64
    batching: bool = True  # False where the model has max_batch_size 0: batch settings stay as found
    own_settings: bool = True  # False for an ensemble: only its composing models' instances change
    composing: tuple[str, ...] = ()  # the composing models, each an axis of its instance count
    # The instance kinds tried (KIND_CPU, KIND_GPU) where the server has GPUs; empty: the
    # model's own kind stays.
    instance_kinds: tuple[str, ...] = ()

    @property
    def axes(self) -> tuple[str, ...]:
        """The axes the climb walks: the model's own, then "instances:<model>" of each composing."""
        own = OWN_AXES if self.own_settings else ()
        return (*own, *(f"instances:{name}" for name in self.composing))

    def batch_sizes(self) -> list[int]:
        if not self.batching:
            return [0]
        sizes, size = [], 1
        while size <= self.max_batch_size:
            sizes.append(size)
            size *= 2
        return sizes

    def all_settings(self, start: ModelSettings) -> list[ModelSettings]:
        """Every combination within the bounds; an ensemble's own settings stay `start`'s."""
        own = [start] if not self.own_settings else self._own_settings(start.instance_kind)
        counts = range(1, self.max_instance_count + 1)
        found = [
            replace(settings, composing=tuple(zip(self.composing, combination, strict=True)))
            for settings in own
            for combination in itertools.product(counts, repeat=len(self.composing))
        ]
        return sorted(set(found))

    def _own_settings(self, start_kind: str) -> list[ModelSettings]:
        found = []
        counts = range(1, self.max_instance_count + 1)
        for batch, count, kind in itertools.product(self.batch_sizes(), counts, self._kinds(start_kind)):
            found.append(ModelSettings(batch, False, count, instance_kind=kind))
            if batch > 0:
                delays = self.queue_delays_us
                found.extend(ModelSettings(batch, True, count, delay, instance_kind=kind) for delay in delays)
        return found

    def _kinds(self, start_kind: str) -> tuple[str, ...]:
        return self.instance_kinds or (start_kind,)

    def clamp(self, settings: ModelSettings) -> ModelSettings:
        """`settings` brought into the bounds (the climb starts from the model's own)."""
        composing = tuple((name, self._count(count)) for name, count in settings.composing)
        if not self.own_settings:
            return replace(settings, composing=composing)
        sizes = self.batch_sizes()
        batch = max((size for size in sizes if size <= max(settings.max_batch_size, 1)), default=sizes[0])
        delay = min(self.queue_delays_us, key=lambda value: abs(value - settings.max_queue_delay_us))
        batching = settings.dynamic_batching and batch > 0
        count = self._count(settings.instance_count)
        kinds = self._kinds(settings.instance_kind)
        kind = settings.instance_kind if settings.instance_kind in kinds else kinds[-1]
        return ModelSettings(batch, batching, count, delay if batching else 0, composing, instance_kind=kind)

    def _count(self, count: int) -> int:
        return min(max(count, 1), self.max_instance_count)

    def step(self, settings: ModelSettings, axis: str, direction: int) -> ModelSettings | None:
        """The settings one step along `axis` ("batch", "dynamic_batching", "queue_delay", "kind",
        "instances", "instances:<composing model>") up (+1) or down (-1) from `settings`; None
        past the bounds."""
        if axis.startswith("instances:"):
            return self._composing_step(settings, axis.removeprefix("instances:"), direction)
        if not self.own_settings:
            return None
        if axis == "instances":
            count = settings.instance_count + direction
            return replace(settings, instance_count=count) if 1 <= count <= self.max_instance_count else None
        if axis == "kind":
            kinds = self._kinds(settings.instance_kind)
            index = kinds.index(settings.instance_kind) + direction if settings.instance_kind in kinds else -1
            return replace(settings, instance_kind=kinds[index]) if 0 <= index < len(kinds) else None
        if settings.max_batch_size == 0:
            return None  # the model does not batch: only its instances change
        if axis == "batch":
            # Without dynamic batching, batch-1 requests run one by one whatever the size; with
            # it, a size of 1 forms no batch: the climb spends no measurement on either.
            sizes = [size for size in self.batch_sizes() if size > 1]
            if not settings.dynamic_batching or settings.max_batch_size not in sizes:
                return None
            index = sizes.index(settings.max_batch_size) + direction
            return replace(settings, max_batch_size=sizes[index]) if 0 <= index < len(sizes) else None
        if axis == "dynamic_batching":
            if settings.dynamic_batching == (direction > 0):
                return None
            if direction < 0:
                return replace(settings, dynamic_batching=False, max_queue_delay_us=0)
            batch = max(settings.max_batch_size, 2)  # the smallest size that batches
            if batch not in self.batch_sizes():
                return None
            return replace(
                settings,
                dynamic_batching=True,
                max_batch_size=batch,
                max_queue_delay_us=self.queue_delays_us[0],
            )
        if not settings.dynamic_batching:
            return None
        index = self.queue_delays_us.index(settings.max_queue_delay_us) + direction
        if not 0 <= index < len(self.queue_delays_us):
            return None
        return replace(settings, max_queue_delay_us=self.queue_delays_us[index])

    def _composing_step(self, settings: ModelSettings, model: str, direction: int) -> ModelSettings | None:
        counts = dict(settings.composing)
        count = counts[model] + direction
        if not 1 <= count <= self.max_instance_count:
            return None
        counts[model] = count
        return replace(settings, composing=tuple(counts.items()))


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


async def brute(space: SearchSpace, start: ModelSettings, evaluate: Evaluate) -> None:
    """Every settings within the bounds but `start` (the model as found, measured first)."""
    for settings in space.all_settings(start):
        if settings != start:
            await evaluate(settings)


async def quick(
    space: SearchSpace,
    start: ModelSettings,
    evaluate: Evaluate,
    constraints: Constraints,
    objective: str,
    expect: Callable[[int], None] | None = None,
) -> None:
    """A coordinate climb from `start` (brought into the bounds): along each axis in turn, step
    up while that does better, else down while that does; again over all axes until a whole
    pass moves nothing (at most MAX_PASSES). `expect` is told, before each axis, how many more
    settings the climb expects to measure (the progress line's ETA)."""
    measured: dict[ModelSettings, list[Measurement]] = {}

    async def better(candidate: ModelSettings, current: ModelSettings) -> bool:
        for settings in (candidate, current):
            if settings not in measured:
                measured[settings] = await evaluate(settings)
        # `current` first: on a tie it stays (the ranking's order is stable).
        ranking = rank([*measured[current], *measured[candidate]], constraints, objective)
        leaders = ranking.passing or ranking.closest
        return bool(leaders) and leaders[0].settings == candidate

    current = space.clamp(start)
    for passes_left in range(MAX_PASSES - 1, -1, -1):
        moved = False
        for index, axis in enumerate(space.axes):
            if expect is not None:
                expect(_expected_more(space, current, space.axes[index:], measured, moved, passes_left))
            for direction in (1, -1):
                stepped = False
                while (candidate := space.step(current, axis, direction)) is not None:
                    if not await better(candidate, current):
                        break
                    current, stepped, moved = candidate, True, True
                if stepped:
                    break  # up did better: down need not be tried
        if not moved:
            return


def _expected_more(
    space: SearchSpace,
    current: ModelSettings,
    axes: tuple[str, ...],
    measured: dict[ModelSettings, list[Measurement]],
    moved: bool,
    passes_left: int,
) -> int:
    """An estimate of the settings the climb still measures: the unmeasured neighbours of
    `current` along the axes left in this pass, and, where this pass has moved, one per axis
    for the pass that checks the new place."""
    neighbours = {space.step(current, axis, direction) for axis in axes for direction in (1, -1)}
    more = sum(1 for settings in neighbours - {None} if settings not in measured)
    return more + (len(space.axes) if moved and passes_left else 0)
