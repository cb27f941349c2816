"""`coreserve analyze`'s search: the bounds of the space, the climb, when a sweep goes on, and
which settings win. The measurements here are data written by the test (the search and the
ranking are pure functions of them); tests/e2e/analyze/test_analyze.py measures a real server."""

from __future__ import annotations

import asyncio
import io
import json
import re

from coreserve.analyze._points import CPU, GPU, Measurement, ModelSettings
from coreserve.analyze._ranking import Constraints, rank
from coreserve.analyze.search._progress import Progress
from coreserve.analyze.search._strategy import (
    OWN_AXES,
    Evaluate,
    SearchSpace,
    brute,
    concurrency_levels,
    keep_going,
    quick,
)
from coreserve.protos.model_config_pb2 import ModelConfig, ModelInstanceGroup


def point(settings: ModelSettings, concurrency: int, throughput: float, p99: float) -> Measurement:
    return Measurement(settings, concurrency, throughput=throughput, p99_ms=p99)


def test_the_space_holds_every_combination_within_the_bounds() -> None:
    space = SearchSpace(max_batch_size=4, max_instance_count=2, queue_delays_us=(0, 500))
    found = space.all_settings(ModelSettings(1, False, 1))
    assert space.batch_sizes() == [1, 2, 4]
    # per batch size and count: without dynamic batching, and with it at each delay
    assert len(found) == 3 * 2 * 3 == len(set(found))
    assert ModelSettings(4, True, 2, 500) in found
    assert ModelSettings(8, False, 1) not in found


def test_a_model_that_does_not_batch_is_searched_over_instances_only() -> None:
    space = SearchSpace(max_instance_count=3, batching=False)
    assert space.all_settings(ModelSettings(0, False, 1)) == [ModelSettings(0, False, c) for c in (1, 2, 3)]
    here = ModelSettings(0, False, 2)
    assert [space.step(here, "instances", d) for d in (1, -1)] == [
        ModelSettings(0, False, 3),
        ModelSettings(0, False, 1),
    ]
    assert {space.step(here, axis, 1) for axis in ("batch", "dynamic_batching", "queue_delay")} == {None}


def test_a_step_changes_one_setting_by_one_notch_within_the_bounds() -> None:
    space = SearchSpace(max_batch_size=8, max_instance_count=3, queue_delays_us=(0, 100, 1000))
    here = ModelSettings(4, True, 2, 100)
    steps = {(axis, d): space.step(here, axis, d) for axis in OWN_AXES for d in (1, -1)}
    assert steps == {
        ("batch", 1): ModelSettings(8, True, 2, 100),
        ("batch", -1): ModelSettings(2, True, 2, 100),
        ("dynamic_batching", 1): None,  # already on
        ("dynamic_batching", -1): ModelSettings(4, False, 2),
        ("queue_delay", 1): ModelSettings(4, True, 2, 1000),
        ("queue_delay", -1): ModelSettings(4, True, 2, 0),
        ("kind", 1): None,  # no GPU: the model's own kind stays
        ("kind", -1): None,
        ("instances", 1): ModelSettings(4, True, 3, 100),
        ("instances", -1): ModelSettings(4, True, 1, 100),
    }
    edge = ModelSettings(8, False, 3)
    assert space.step(edge, "batch", 1) is None and space.step(edge, "instances", 1) is None
    assert space.step(edge, "queue_delay", 1) is None  # no delay without dynamic batching
    assert space.step(edge, "dynamic_batching", 1) == ModelSettings(8, True, 3, 0)


def test_where_the_server_has_gpus_the_instances_kind_is_an_axis() -> None:
    space = SearchSpace(max_batch_size=2, max_instance_count=2, instance_kinds=(CPU, GPU))
    on_cpu = ModelSettings(2, True, 1, instance_kind=CPU)
    on_gpu = ModelSettings(2, True, 1, instance_kind=GPU)
    assert space.step(on_cpu, "kind", 1) == on_gpu and space.step(on_cpu, "kind", -1) is None
    assert space.step(on_gpu, "kind", -1) == on_cpu and space.step(on_gpu, "kind", 1) is None
    # brute: every combination on each kind; the climb starts a model without a kind on the GPU
    found = space.all_settings(on_cpu)
    assert len(found) == 2 * len(SearchSpace(max_batch_size=2, max_instance_count=2).all_settings(on_cpu))
    assert {settings.instance_kind for settings in found} == {CPU, GPU}
    assert space.clamp(ModelSettings(2, True, 1)).instance_kind == GPU
    assert space.clamp(on_cpu) == on_cpu
    assert on_gpu.key.endswith("_gpu") and on_cpu.key == ModelSettings(2, True, 1).key
    assert "on GPU" in on_gpu.describe()


def test_the_kind_is_read_from_and_written_to_every_instance_group() -> None:
    config = ModelConfig(name="m", max_batch_size=4)
    config.instance_group.add(count=2, kind=ModelInstanceGroup.KIND_GPU, gpus=[0])
    assert ModelSettings.of(config).instance_kind == GPU
    on_cpu = ModelSettings(4, False, 3, instance_kind=CPU).applied_to(config)
    assert [(g.count, g.kind, list(g.gpus)) for g in on_cpu.instance_group] == [
        (3, ModelInstanceGroup.KIND_CPU, [])
    ]
    config.instance_group.add(count=1, kind=ModelInstanceGroup.KIND_CPU)
    assert ModelSettings.of(config).instance_kind == ""  # mixed kinds: each group keeps its own
    kept = ModelSettings(4, False, 1).applied_to(config)
    assert [g.kind for g in kept.instance_group] == [ModelInstanceGroup.KIND_GPU, ModelInstanceGroup.KIND_CPU]


def test_the_climb_skips_batch_sizes_that_batch_nothing() -> None:
    # Batch-1 requests: without dynamic batching every size behaves alike, and with it size 1
    # forms no batch. Switching it on from size 1 goes to 2; nothing to switch on under a bound of 1.
    space = SearchSpace(max_batch_size=8, max_instance_count=1)
    assert space.step(ModelSettings(4, False, 1), "batch", 1) is None
    assert space.step(ModelSettings(1, False, 1), "dynamic_batching", 1) == ModelSettings(2, True, 1, 0)
    assert space.step(ModelSettings(2, True, 1), "batch", -1) is None
    assert SearchSpace(max_batch_size=1).step(ModelSettings(1, False, 1), "dynamic_batching", 1) is None
    assert space.axes[:2] == ("dynamic_batching", "batch")


def test_the_climb_starts_inside_the_bounds() -> None:
    space = SearchSpace(max_batch_size=4, max_instance_count=2, queue_delays_us=(0, 100))
    assert space.clamp(ModelSettings(16, True, 5, 90)) == ModelSettings(4, True, 2, 100)
    assert space.clamp(ModelSettings(3, False, 0)) == ModelSettings(2, False, 1)


def test_settings_apply_to_a_configuration_and_read_back() -> None:
    base = ModelConfig(name="m", max_batch_size=8, backend="python")
    base.instance_group.add(count=1, kind=ModelConfig().instance_group.add().KIND_CPU)
    settings = ModelSettings(4, True, 3, 250, instance_kind=CPU)
    config = settings.applied_to(base)
    assert (config.max_batch_size, config.dynamic_batching.max_queue_delay_microseconds) == (4, 250)
    assert [group.count for group in config.instance_group] == [3]
    assert ModelSettings.of(config) == settings
    assert not ModelSettings(4, False, 1).applied_to(config).HasField("dynamic_batching")
    assert base.max_batch_size == 8  # the base is not changed
    base.dynamic_batching.preferred_batch_size.extend([2, 4, 8])
    assert list(ModelSettings(4, True, 1).applied_to(base).dynamic_batching.preferred_batch_size) == [2, 4]
    # The size the server fills in (the base's max batch size, as Triton's) is no choice: a
    # larger candidate does not batch at it (its own load fills in its own).
    del base.dynamic_batching.preferred_batch_size[:]
    base.dynamic_batching.preferred_batch_size.append(8)
    assert list(ModelSettings(16, True, 1).applied_to(base).dynamic_batching.preferred_batch_size) == []


def test_concurrency_doubles_and_stops_when_throughput_stops_growing() -> None:
    settings = ModelSettings(1, False, 1)
    assert list(concurrency_levels(SearchSpace(max_concurrency=10))) == [1, 2, 4, 8]
    growing = [point(settings, 1, 100, 1), point(settings, 2, 180, 1)]
    assert keep_going(growing, Constraints())
    flat = [*growing, point(settings, 4, 185, 2)]  # under 5% more
    assert not keep_going(flat, Constraints())
    assert not keep_going(growing, Constraints(latency_budget_ms=0.5))  # past the budget
    assert not keep_going([Measurement(settings, 1, error="failed to load: no")], Constraints())


def test_a_settings_is_as_good_as_its_best_level_within_the_constraints() -> None:
    small, large = ModelSettings(1, False, 1), ModelSettings(4, True, 1)
    points = [
        point(small, 1, 100, 2),
        point(small, 2, 150, 4),
        point(large, 1, 120, 3),
        point(large, 2, 400, 25),  # the most throughput, but past a 20 ms budget
        Measurement(ModelSettings(8, True, 1), 0, error="failed to load: too big"),
    ]
    ranking = rank(points, Constraints(latency_budget_ms=20))
    assert [(p.settings, p.concurrency) for p in ranking.passing] == [(small, 2), (large, 1)]
    assert rank(points, Constraints(latency_budget_ms=20), "latency").passing[0] == points[0]
    nothing = rank(points, Constraints(latency_budget_ms=1))
    assert nothing.passing == [] and [p.settings for p in nothing.closest] == [small, large]
    assert Constraints(latency_budget_ms=20).violations(points[3]) == ["p99 25.0 ms > budget 20 ms"]


def surface(settings: ModelSettings) -> list[Measurement]:
    """A model whose throughput grows with batch size and instances up to (8, 2 instances),
    with dynamic batching; latency grows with batch size."""
    batch = min(settings.max_batch_size, 8)
    bonus = 1.5 if settings.dynamic_batching else 1.0
    throughput = 100 * batch * bonus * min(settings.instance_count, 2)
    p99 = settings.max_batch_size * 1.5
    return [point(settings, 1, throughput, p99)]


def test_quick_climbs_to_the_best_settings_measuring_fewer_than_brute() -> None:
    space = SearchSpace(max_batch_size=16, max_instance_count=4, queue_delays_us=(0,))
    measured: dict[str, list[ModelSettings]] = {"brute": [], "quick": []}

    def evaluator(kind: str) -> Evaluate:
        async def evaluate(settings: ModelSettings) -> list[Measurement]:
            measured[kind].append(settings)
            return surface(settings)

        return evaluate

    estimates: list[tuple[int, int]] = []  # (settings measured so far, how many more it expects)

    def expect(more: int) -> None:
        estimates.append((len(measured["quick"]), more))

    constraints = Constraints(latency_budget_ms=13)  # batch 16 is too slow
    asyncio.run(brute(space, ModelSettings(1, False, 1), evaluator("brute")))
    asyncio.run(
        quick(space, ModelSettings(1, False, 1), evaluator("quick"), constraints, "throughput", expect)
    )
    best = rank([p for s in measured["brute"] for p in surface(s)], constraints).passing[0]
    found = rank([p for s in measured["quick"] for p in surface(s)], constraints).passing[0]
    assert best.settings.max_batch_size == 8 and best.settings.dynamic_batching
    assert found.throughput == best.throughput
    assert len(set(measured["quick"])) == len(measured["quick"])  # nothing measured twice
    assert len(measured["quick"]) <= len(measured["brute"]) / 3  # issue 36: a third at most
    # The ETA's estimate: given before each axis; in the last pass, which moves nothing, it is exact.
    assert len(estimates) > len(space.axes) and estimates[0][1] > 0
    done_before, expected = estimates[-1]
    assert expected == len(measured["quick"]) - done_before


def test_the_quick_searchs_progress_line_has_its_estimate() -> None:
    lines = io.StringIO()
    progress = Progress(None, lines)
    progress.measured(Measurement(ModelSettings(1, False, 1), 1, throughput=10, p99_ms=1))
    progress.settings_finished()
    progress.expect(3)
    progress.measured(Measurement(ModelSettings(2, True, 1), 1, throughput=20, p99_ms=1))
    first, second = lines.getvalue().splitlines()
    assert first.startswith("[configuration 1, 0:00] mbs1_nodb_i1 concurrency 1: 10 infer/s")
    assert re.match(r"\[configuration 2, 0:00, about 3 more, ETA ~0:00\] mbs2_db0_i1 ", second)


def test_brute_measures_all_but_the_start_which_is_measured_first() -> None:
    space = SearchSpace(max_batch_size=1, max_instance_count=2)
    start = ModelSettings(1, False, 1)
    seen: list[ModelSettings] = []

    async def evaluate(settings: ModelSettings) -> list[Measurement]:
        seen.append(settings)
        return []

    asyncio.run(brute(space, start, evaluate))
    assert seen == [s for s in space.all_settings(start) if s != start] and len(seen) == 3


def test_an_ensemble_sweeps_its_steps_instances_and_keeps_its_own_settings() -> None:
    start = ModelSettings(8, False, 1, composing=(("pre", 1), ("net", 2)), own_settings=False)
    space = SearchSpace(max_instance_count=3, own_settings=False, composing=("pre", "net"))
    assert space.axes == ("instances:pre", "instances:net")
    found = space.all_settings(start)
    assert len(found) == 3 * 3
    assert all((s.max_batch_size, s.own_settings) == (8, False) for s in found)
    assert space.step(start, "instances:net", 1) == ModelSettings(
        8, False, 1, composing=(("pre", 1), ("net", 3)), own_settings=False
    )
    assert space.step(start, "instances:pre", -1) is None
    assert space.step(start, "batch", 1) is None
    assert start.key == "pre-i1_net-i2"
    assert start.describe() == "pre: 1 instance, net: 2 instances"


def test_a_bls_model_sweeps_its_own_settings_and_its_callees_instances() -> None:
    space = SearchSpace(max_batch_size=2, max_instance_count=2, composing=("scale",))
    assert space.axes == (*OWN_AXES, "instances:scale")
    start = ModelSettings(2, False, 1, composing=(("scale", 4),))
    assert space.clamp(start) == ModelSettings(2, False, 1, composing=(("scale", 2),))
    assert len(space.all_settings(start)) == 2 * 2 * 2 * 2  # batch, batching, own and callee counts
    assert start.key == "mbs2_nodb_i1_scale-i4"
    point = Measurement(start, 1, throughput=5.0)
    assert Measurement.from_json(json.loads(json.dumps(point.to_json()))) == point


def test_settings_of_a_composed_model_read_its_parts_counts() -> None:
    ensemble = ModelConfig(name="e", platform="ensemble", max_batch_size=4)
    part = ModelConfig(name="p")
    part.instance_group.add(count=3)
    settings = ModelSettings.of(ensemble, {"p": part})
    assert (settings.own_settings, settings.composing) == (False, (("p", 3),))
    assert settings.applied_to(ensemble) == ensemble
