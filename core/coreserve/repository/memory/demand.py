"""Loading models on demand (`--model-load-on-demand`): one load per model, shared by the
requests that wait for it, and the counts the metrics report about loads and evictions.

A request for a model of the repository that is not loaded starts its load and waits for it;
the requests for the same model that come meanwhile wait for that same load. A waiting request
gives up when its `timeout` parameter (Triton's, in microseconds) runs out, or when its caller
goes (a gRPC deadline, a closed HTTP connection): the load goes on for the others. At most
`DEMAND_WAITERS` requests wait for one model; more are refused as a full queue is.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from coreserve.errors import UnavailableError

DEMAND_WAITERS = 1024  # requests that may wait for one model's load on demand
# Bounds of coreserve_model_load_wait_seconds, in seconds.
WAIT_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
LOAD_REASONS = ("startup", "explicit", "demand", "poll")


@dataclass
class LifecycleCounts:
    """Loads by reason, evictions, and the waits of requests for loads on demand."""

    loads: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LOAD_REASONS, 0))
    evictions: int = 0
    wait_buckets: list[int] = field(default_factory=lambda: [0] * (len(WAIT_BUCKETS_S) + 1))
    wait_sum_s: float = 0.0

    def observe_wait(self, seconds: float) -> None:
        for index, bound in enumerate([*WAIT_BUCKETS_S, math.inf]):
            if seconds <= bound:
                self.wait_buckets[index] += 1
                break
        self.wait_sum_s += seconds


class DemandLoads:
    """The loads on demand in progress, one per model name, and the requests that wait on them."""

    def __init__(
        self,
        load: Callable[[str], Coroutine[Any, Any, None]],
        counts: LifecycleCounts,
        max_waiting: int = DEMAND_WAITERS,
    ) -> None:
        self._load = load
        self._counts = counts
        self._max_waiting = max_waiting
        self._loads: dict[str, asyncio.Task[None]] = {}
        self._waiting: dict[str, int] = {}

    def running(self, name: str) -> bool:
        """Whether a load on demand of `name` is under way."""
        return name in self._loads

    def waiting(self, name: str) -> int:
        """How many requests wait for `name`'s load now."""
        return self._waiting.get(name, 0)

    async def wait(self, name: str, timeout: float | None) -> None:
        """Starts `name`'s load unless it is under way, and waits for it (at most `timeout` s).

        Raises what the load raised, or UnavailableError when the time runs out or too many
        requests wait already.
        """
        if self._waiting.get(name, 0) >= self._max_waiting:
            raise UnavailableError(
                f"Exceeds maximum queue size: {self._max_waiting} requests already wait for model "
                f"'{name}' to load on demand"
            )
        task = self._loads.get(name)
        if task is None:
            task = asyncio.create_task(self._load(name), name=f"load-on-demand:{name}")
            self._loads[name] = task
            task.add_done_callback(lambda done: self._finished(name, done))
        self._waiting[name] = self._waiting.get(name, 0) + 1
        started = time.monotonic()
        try:
            # shield: a waiter that gives up (timeout, cancelled caller) leaves the load running.
            await asyncio.wait_for(asyncio.shield(task), timeout)
        except TimeoutError:
            raise UnavailableError(
                f"Request timeout expired: model '{name}' was still loading on demand after {timeout:g} s"
            ) from None
        finally:
            self._waiting[name] -= 1
            if not self._waiting[name]:
                del self._waiting[name]
            self._counts.observe_wait(time.monotonic() - started)

    def _finished(self, name: str, task: asyncio.Task[None]) -> None:
        if self._loads.get(name) is task:
            del self._loads[name]
        if not task.cancelled():
            task.exception()  # (retrieved: each waiter got it already, or none waits any more)
