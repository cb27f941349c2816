"""InstanceThread runs quick calls inline and slow ones on its thread."""

from __future__ import annotations

import asyncio
import threading
import time

from coreserve.backend import InstanceThread


def _where() -> str:
    return threading.current_thread().name


def test_quick_calls_move_inline_and_slow_ones_go_back() -> None:
    async def scenario() -> tuple[list[str], list[str], list[str]]:
        thread = InstanceThread("test-instance", inline_below_us=50_000)
        learning = [await thread.run(_where) for _ in range(8)]
        quick = [await thread.run(_where) for _ in range(3)]

        def slow() -> str:
            time.sleep(0.25)  # 5x the limit
            return _where()

        after_slow = [await thread.run(slow), await thread.run(_where)]
        thread.close()
        return learning, quick, after_slow

    learning, quick, after_slow = asyncio.run(scenario())
    main = threading.main_thread().name
    assert all(name.startswith("test-instance") for name in learning)
    assert quick == [main] * 3
    assert after_slow[0] == main  # measured inline, then the instance gives up inlining
    assert after_slow[1].startswith("test-instance")


def test_zero_limit_always_uses_the_thread() -> None:
    async def scenario() -> list[str]:
        thread = InstanceThread("never-inline", inline_below_us=0)
        names = [await thread.run(_where) for _ in range(20)]
        thread.close()
        return names

    assert all(name.startswith("never-inline") for name in asyncio.run(scenario()))


def test_exceptions_propagate_from_both_places() -> None:
    def fail() -> None:
        raise ValueError("boom")

    async def scenario() -> int:
        thread = InstanceThread("raising", inline_below_us=50_000)
        failures = 0
        for _ in range(12):
            try:
                await thread.run(fail)
            except ValueError:
                failures += 1
        thread.close()
        return failures

    assert asyncio.run(scenario()) == 12
