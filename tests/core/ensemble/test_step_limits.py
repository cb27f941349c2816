"""max_inflight_requests' slots in-process: taken in order, handed over on release, never lost
to a wait that is cancelled, and taken all the same (with Triton's error line) after the wait."""

from __future__ import annotations

import asyncio
import logging

import pytest

from coreserve.ensemble._step_limits import StepLimit, StepLimits


def test_slots_go_to_the_waiters_in_order_and_come_back() -> None:
    async def scenario() -> list[str]:
        limit = StepLimit(2)
        order: list[str] = []

        async def take(name: str) -> None:
            await limit.acquire("ens", 0)
            order.append(name)

        await take("a")
        await take("b")
        waiters = [asyncio.create_task(take(name)) for name in ("c", "d")]
        await asyncio.sleep(0)
        assert order == ["a", "b"] and limit.in_flight == 2
        limit.release()
        await asyncio.sleep(0)
        assert order == ["a", "b", "c"] and limit.in_flight == 2  # handed over, not freed
        limit.release()
        await asyncio.gather(*waiters)
        limit.release()
        limit.release()
        assert limit.in_flight == 0
        return order

    assert asyncio.run(scenario()) == ["a", "b", "c", "d"]


def test_a_cancelled_wait_takes_no_slot_even_when_one_was_handed_over_as_it_was_cancelled() -> None:
    async def scenario() -> int:
        limit = StepLimit(1)
        await limit.acquire("ens", 0)
        first = asyncio.create_task(limit.acquire("ens", 0))
        second = asyncio.create_task(limit.acquire("ens", 0))
        await asyncio.sleep(0)
        first.cancel()  # cancelled while waiting: it leaves the line
        await asyncio.sleep(0)
        limit.release()  # the slot goes to `second` ...
        second.cancel()  # ... which is cancelled before it runs: it passes the slot on, freed
        for task in (first, second):
            with pytest.raises(asyncio.CancelledError):
                await task
        return limit.in_flight

    assert asyncio.run(scenario()) == 0


def test_a_step_that_waited_too_long_goes_over_the_limit_with_tritons_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> int:
        limit = StepLimit(1, wait_s=0.05)
        await limit.acquire("ens", 3)
        await limit.acquire("ens", 3)
        return limit.in_flight

    with caplog.at_level(logging.ERROR):
        assert asyncio.run(scenario()) == 2
    assert (
        "[Internal Error] Ensemble 'ens' unable to schedule step 3 (inflight: 1 >= limit: 1) for 0.05 "
        "seconds. Proceeding to avoid deadlock." in caplog.text
    )


def test_a_step_tasks_slot_is_freed_even_when_it_is_cancelled_before_it_runs() -> None:
    async def scenario() -> None:
        limits = StepLimits("ens", steps=2, limit=1)
        await limits.acquire(1)
        task = asyncio.create_task(asyncio.sleep(10))
        limits.release_when_done(task, 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        async with asyncio.timeout(5):  # (it would wait for ever had the slot been lost)
            await limits.acquire(1)

    asyncio.run(scenario())


def test_no_limit_costs_nothing() -> None:
    async def scenario() -> bool:
        limits = StepLimits("ens", steps=3, limit=0)
        for _ in range(10_000):
            await limits.acquire(0)
        return limits.enabled

    assert asyncio.run(scenario()) is False
