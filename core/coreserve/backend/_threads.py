"""Where a backend's blocking framework calls run: on the instance's own thread, or inline.

A hop to a worker thread and back costs tens of microseconds and two GIL hand-overs, which
is more than a tiny model takes to run. So an `InstanceThread` times the calls it makes and
runs them inline on the event loop while they stay quicker than `inline_below_us`; calls that
take longer go (back) to the thread, so a large model never blocks the loop for long.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

DEFAULT_INLINE_BELOW_US = 200
# Calls made on the thread before the first decision, and the weight of a new observation.
_LEARNING_CALLS = 8
_SMOOTHING = 0.2


class InstanceThread:
    """Runs one instance's blocking calls, one at a time, inline when they are quick enough.

    `inline_below_us=0` always uses the thread; None means the default (200 µs).
    """

    def __init__(self, name: str, inline_below_us: int | None = None) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        limit_us = DEFAULT_INLINE_BELOW_US if inline_below_us is None else inline_below_us
        self._limit_ns = limit_us * 1000
        self._average_ns = 0.0
        self._calls = 0
        self.inline = False

    def _observe(self, elapsed_ns: int) -> None:
        self._calls += 1
        if self._calls == 1:
            self._average_ns = float(elapsed_ns)
        else:
            self._average_ns += _SMOOTHING * (elapsed_ns - self._average_ns)
        if self._limit_ns and self._calls >= _LEARNING_CALLS:
            # Hysteresis: switching costs nothing, but flapping around the limit would.
            if self.inline:
                self.inline = self._average_ns < self._limit_ns and elapsed_ns < 4 * self._limit_ns
            else:
                self.inline = self._average_ns < self._limit_ns / 2

    def _timed(self, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        started = time.perf_counter_ns()
        try:
            return function(*args, **kwargs)
        finally:
            self._observe(time.perf_counter_ns() - started)

    async def run(self, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        if self.inline:
            return self._timed(function, *args, **kwargs)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: self._timed(function, *args, **kwargs))

    def close(self) -> None:
        self._executor.shutdown(wait=False)
