"""The rate limiter in-process: resource counts, Triton's errors, and the order of turns."""

from __future__ import annotations

import asyncio

import pytest
from google.protobuf import text_format

from coreserve.errors import ModelConfigError
from coreserve.protos.model_config_pb2 import ModelOptimizationPolicy, ModelRateLimiter
from coreserve.scheduling.rate_limiter import (
    EVERY_DEVICE,
    GLOBAL,
    InstanceSlot,
    RateLimiter,
    RateLimitSettingError,
    ResourceSetting,
    parse_resource_setting,
)


def _config(text: str) -> ModelRateLimiter:
    return text_format.Parse(text, ModelRateLimiter())


def _needs(*resources: str, priority: int = 0) -> ModelRateLimiter:
    """A rate_limiter asking for `name:count` or `name:count:global` resources."""
    entries = []
    for resource in resources:
        name, count, *scope = resource.split(":")
        entries.append(f'{{ name: "{name}" count: {count} global: {str(bool(scope)).lower()} }}')
    return _config(f"resources [ {', '.join(entries)} ] priority: {priority}")


async def _run_turns(limiter: RateLimiter, plan: dict[str, tuple[InstanceSlot, int]]) -> str:
    """Each slot runs its count of turns back to back; returns who ran, in order."""
    order: list[str] = []

    async def run(name: str, slot: InstanceSlot, turns: int) -> None:
        for _ in range(turns):
            async with limiter.turn(slot):
                order.append(name)
                await asyncio.sleep(0)

    await asyncio.gather(*(run(name, slot, turns) for name, (slot, turns) in plan.items()))
    return "".join(order)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("R1:10", ResourceSetting("R1", 10, EVERY_DEVICE)), ("R2:5:1", ResourceSetting("R2", 5, 1))],
)
def test_resource_settings_read_as_triton_reads_them(text: str, expected: ResourceSetting) -> None:
    assert parse_resource_setting(text) == expected


@pytest.mark.parametrize("text", ["R1", "R1:", "R1:x", ":4", "R1:4:0:1", "R1:4:gpu", "R1:-1"])
def test_malformed_resource_settings_are_refused_with_the_format(text: str) -> None:
    with pytest.raises(RateLimitSettingError) as error:
        parse_resource_setting(text)
    assert "--rate-limit-resource option format is '<resource_name>:<count>:<device>'" in str(error.value)
    assert f"Got {text}" in str(error.value)


def test_by_default_each_resource_has_the_most_any_instance_asks_for() -> None:
    # Triton's documented example: A [R1: 4, R2: 4], B [R2: 5, R3: 10, R4: 5], C [R1: 1, R3: 7, R4: 2].
    limiter = RateLimiter()
    limiter.register("a", [(_needs("R1:4", "R2:4"), 0)])
    limiter.register("b", [(_needs("R2:5", "R3:10", "R4:5"), 0)])
    limiter.register("c", [(_needs("R1:1", "R3:7", "R4:2"), 0)])
    assert limiter.limits == {0: {"R1": 4, "R2": 5, "R3": 10, "R4": 5}}


def test_flags_give_counts_per_device_and_globally() -> None:
    # Triton's example: R1:10, R2:5:0, R2:8:1, R3:2 with R3 global in a model.
    settings = [parse_resource_setting(text) for text in ("R1:10", "R2:5:0", "R2:8:1", "R3:2")]
    limiter = RateLimiter(settings)
    limiter.register("a", [(_needs("R1:1", "R2:1"), 0), (_needs("R1:1", "R2:1"), 1)])
    limiter.register("b", [(_needs("R3:1:global"), 0)])
    assert limiter.limits == {GLOBAL: {"R3": 2}, 0: {"R1": 10, "R2": 5}, 1: {"R1": 10, "R2": 8}}


def test_a_resource_no_flag_gives_fails_the_model_that_names_it() -> None:
    limiter = RateLimiter([ResourceSetting("R1", 4)])
    with pytest.raises(ModelConfigError) as error:
        limiter.register("a", [(_needs("R1:1", "GPU_MEMORY:2"), 0)])
    assert str(error.value).startswith(
        'Resource count for "GPU_MEMORY" is limited to 0 which will prevent scheduling of one or more '
        "model instances, the minimum required count is 2"
    )
    assert limiter.limits == {}  # nothing of the refused model stays
    limiter.register("b", [(_needs("R1:4"), 0)])
    assert limiter.limits == {0: {"R1": 4}}


def test_a_flag_below_what_an_instance_needs_fails_its_model() -> None:
    limiter = RateLimiter([ResourceSetting("R1", 2)])
    with pytest.raises(ModelConfigError, match=r'"R1" is limited to 2 .* the minimum required count is 3'):
        limiter.register("a", [(_needs("R1:3"), 0)])


def test_a_resource_both_global_and_per_device_is_refused() -> None:
    limiter = RateLimiter()
    limiter.register("a", [(_needs("R1:1:global"), 0)])
    with pytest.raises(ModelConfigError) as error:
        limiter.register("b", [(_needs("R1:1"), 0)])
    assert str(error.value) == (
        'Resource "R1" is present as both global and device-specific resource in the model configuration.'
    )


def test_unloading_a_model_lowers_the_default_counts() -> None:
    limiter = RateLimiter()
    [small] = limiter.register("a", [(_needs("R1:1"), 0)])
    big = limiter.register("b", [(_needs("R1:4"), 0)])
    assert limiter.limits == {0: {"R1": 4}}
    limiter.unregister(big)
    assert limiter.limits == {0: {"R1": 1}}
    limiter.unregister([small])
    assert limiter.limits == {}


def test_two_instances_needing_the_whole_resource_take_turns_and_priority_two_gets_half() -> None:
    async def scenario() -> str:
        limiter = RateLimiter()
        [first] = limiter.register("first", [(_needs("R:2", priority=1), 0)])
        [second] = limiter.register("second", [(_needs("R:2", priority=2), 0)])
        return await _run_turns(limiter, {"a": (first, 30), "b": (second, 30)})

    order = asyncio.run(scenario())
    contended = order[:45]  # both still have turns to take
    assert contended.count("b") == 15, order


def test_instances_that_fit_together_run_together() -> None:
    async def scenario() -> int:
        limiter = RateLimiter()
        slots = limiter.register("m", [(_needs("R:1"), 0)] * 3)
        limiter.register("big", [(_needs("R:3"), 0)])
        running = most = 0

        async def run(slot: InstanceSlot) -> None:
            nonlocal running, most
            async with limiter.turn(slot):
                running += 1
                most = max(most, running)
                await asyncio.sleep(0.01)
                running -= 1

        await asyncio.gather(*(run(slot) for slot in slots))
        return most

    assert asyncio.run(scenario()) == 3


def test_model_priority_max_runs_before_default_and_min_whatever_their_counts() -> None:
    async def scenario() -> str:
        limiter = RateLimiter()
        whole = _needs("R:1")
        [low] = limiter.register("low", [(whole, 0)], ModelOptimizationPolicy.PRIORITY_MIN)
        [mid] = limiter.register("mid", [(whole, 0)])
        [high] = limiter.register("high", [(whole, 0)], ModelOptimizationPolicy.PRIORITY_MAX)
        return await _run_turns(limiter, {"l": (low, 4), "m": (mid, 4), "h": (high, 4)})

    # The first turn goes to the first to ask (nothing competes yet); then strictly by tier.
    assert asyncio.run(scenario()) == "lhhhhmmmmlll"


def test_a_waiting_turn_given_up_does_not_hold_back_the_others() -> None:
    async def scenario() -> list[str]:
        limiter = RateLimiter()
        [holder, quitter, patient] = limiter.register("m", [(_needs("R:1"), 0)] * 3)
        events: list[str] = []
        release = asyncio.Event()

        async def hold() -> None:
            async with limiter.turn(holder):
                events.append("holder")
                await release.wait()

        async def run(slot: InstanceSlot, name: str) -> None:
            async with limiter.turn(slot):
                events.append(name)

        holding = asyncio.create_task(hold())
        await asyncio.sleep(0)
        quitting = asyncio.create_task(run(quitter, "quitter"))
        waiting = asyncio.create_task(run(patient, "patient"))
        await asyncio.sleep(0)
        quitting.cancel()
        release.set()
        await asyncio.gather(holding, waiting)
        return events

    assert asyncio.run(scenario()) == ["holder", "patient"]
