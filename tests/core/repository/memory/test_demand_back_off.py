"""The back-off of a model whose load on demand failed, on a clock the test moves.

A request for a failed model tries its load again only once the back-off has passed since the
last try (RETRY_FIRST_S, doubled with each try that fails, at most RETRY_MOST_S); until then it
gets the model's error. The clock is the test's, so each step asserts whether a try happened,
never how long one took.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from coreserve.errors import CoreserveError
from coreserve.repository.memory import _budgeted
from coreserve.repository.memory._budgeted import RETRY_FIRST_S, RETRY_MOST_S, BudgetedLoads
from coreserve.repository.memory.budgets import MemoryBudgets
from coreserve.repository.model import Model
from coreserve.repository.namespaces import ModelTable

EARLY = 0.25  # seconds before a try is due (a binary fraction: the sums stay exact)


class Clock:
    """`time.monotonic` for the module under test: it moves only when the test moves it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(_budgeted, "time", SimpleNamespace(monotonic=clock, time=time.time))
    return clock


def _failing_loads(tries: list[str]) -> BudgetedLoads:
    """Loads on demand of a model held with its reason, whose every load fails."""
    broken = Model("broken", None, reason="NOT_AN_INPUT")

    async def load(name: str) -> None:
        tries.append(name)
        raise CoreserveError("NOT_AN_INPUT")

    async def close(model: Model) -> None:
        raise AssertionError("nothing is closed")

    return BudgetedLoads(
        ModelTable(),
        set(),
        None,  # type: ignore[arg-type]  # no load goes through the loader here
        find=lambda name: broken,
        lock=lambda key: asyncio.Lock(),
        close=close,
        load=load,
        on_demand=True,
        memory_budgets=MemoryBudgets(),
    )


def test_a_failed_model_is_tried_again_once_its_back_off_has_passed(clock: Clock) -> None:
    tries: list[str] = []

    async def scenario() -> None:
        loads = _failing_loads(tries)
        await loads.demand("broken")  # the first request tries
        assert len(tries) == 1
        await loads.demand("broken")  # at once: held with its reason
        clock.now += RETRY_FIRST_S - EARLY
        await loads.demand("broken")  # just before the back-off has passed
        assert len(tries) == 1
        clock.now += EARLY
        await loads.demand("broken")  # the back-off has passed: tried again
        assert len(tries) == 2
        clock.now += 2 * RETRY_FIRST_S - EARLY  # the back-off has doubled
        await loads.demand("broken")
        assert len(tries) == 2
        clock.now += EARLY
        await loads.demand("broken")
        assert len(tries) == 3

    asyncio.run(scenario())


def test_the_back_off_stops_growing_at_its_most(clock: Clock) -> None:
    tries: list[str] = []

    async def scenario() -> None:
        loads = _failing_loads(tries)
        await loads.demand("broken")
        back_off = RETRY_FIRST_S
        while back_off < RETRY_MOST_S:  # each try fails: the back-off doubles up to its most
            clock.now += back_off
            await loads.demand("broken")
            back_off = min(RETRY_MOST_S, 2 * back_off)
        for _ in range(2):  # at its most, it stays there
            before = len(tries)
            clock.now += RETRY_MOST_S - EARLY
            await loads.demand("broken")
            assert len(tries) == before
            clock.now += EARLY
            await loads.demand("broken")
            assert len(tries) == before + 1

    asyncio.run(scenario())
