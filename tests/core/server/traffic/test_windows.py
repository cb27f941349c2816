"""A rollout's windows: counts past the latencies kept, every worker's added up, and a token
that keeps an ended rollout off the windows of the model's next one."""

from __future__ import annotations

import asyncio

from coreserve.server.traffic._windows import ProcessWindows, added_up


def test_the_counts_go_on_past_the_latencies_kept() -> None:
    windows = ProcessWindows(max_samples=3)
    asyncio.run(windows.open("m", [1, 2], "t"))
    for _ in range(10):
        windows.observe("m", 1, 0.001, ok=True)
    windows.observe("m", 1, 0.5, ok=False)
    window = asyncio.run(windows.read("m", "t"))[1]
    assert (window.successes, window.failures, window.requests) == (10, 1, 11)
    assert len(window.latencies_s) == 3 and window.error_rate() == 1 / 11


def test_every_workers_windows_add_up_with_or_without_latencies() -> None:
    answers = [
        {"1": {"successes": 5, "failures": 1, "latencies_s": [0.1, 0.2]}},
        {
            "1": {"successes": 2, "failures": 0, "latencies_s": []},
            "2": {"successes": 0, "failures": 3, "latencies_s": []},
        },
    ]
    total = added_up(answers)
    assert (total[1].successes, total[1].failures, total[1].latencies_s) == (7, 1, [0.1, 0.2])
    assert (total[2].requests, total[2].error_rate()) == (3, 1.0)


def test_an_ended_rollout_neither_reads_nor_closes_the_next_ones_windows() -> None:
    windows = ProcessWindows()

    async def steps() -> None:
        await windows.open("m", [1, 2], "old")
        await windows.open("m", [1, 3], "new")  # the model's next rollout
        windows.observe("m", 3, 0.01, ok=True)
        assert await windows.read("m", "old") == {}
        await windows.close("m", "old")
        assert windows.observing("m") and (await windows.read("m", "new"))[3].successes == 1
        await windows.close("m", "new")
        assert not windows.observing("m")

    asyncio.run(steps())
