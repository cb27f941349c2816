"""`max_inflight_requests`: at most that many requests of each step in flight at once, over all
the ensemble's requests (Triton's `StepInflightRequestLimiter`).

A step whose limit is reached waits to be sent; a decoupled step's responses wait with it, so
that a fast producer cannot pile up requests for a slow consumer. A step request holds its slot
until it ends (a decoupled one, until its final flag). One that has waited WAIT_S goes all
the same, with Triton's error line, rather than risk a deadlock.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any

logger = logging.getLogger(__name__)

WAIT_S = 300.0  # Triton's kMutexTimeoutSeconds


class StepLimit:
    """One step's slots: `limit` of them, each held by one request of the step."""

    def __init__(self, limit: int, wait_s: float = WAIT_S) -> None:
        self.limit = limit
        self.wait_s = wait_s
        self.in_flight = 0
        self._waiting: deque[asyncio.Future[None]] = deque()

    async def acquire(self, ensemble: str, step_index: int) -> None:
        """Takes a slot, waiting (in order) for one to free; cancelling the wait takes none."""
        if self.in_flight < self.limit and not self._waiting:
            self.in_flight += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        try:
            async with asyncio.timeout(self.wait_s):
                await waiter  # a slot handed over by `release`: in_flight stays
        except TimeoutError:
            if waiter.done() and not waiter.cancelled():  # handed a slot as its time ran out
                return
            logger.error(
                "[Internal Error] Ensemble '%s' unable to schedule step %d (inflight: %d >= limit: %d) "
                "for %g seconds. Proceeding to avoid deadlock.",
                ensemble, step_index, self.in_flight, self.limit, self.wait_s,
            )  # fmt: skip
            self.in_flight += 1
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # handed a slot as it was cancelled
                self.release()
            raise
        finally:
            if not waiter.done():
                waiter.cancel()
            if waiter in self._waiting:
                self._waiting.remove(waiter)

    def release(self) -> None:
        """Frees a slot: the longest waiter takes it."""
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.in_flight -= 1


class StepLimits:
    """The limits of an ensemble's steps; none where `max_inflight_requests` is 0."""

    def __init__(self, ensemble: str, steps: int, limit: int) -> None:
        self._ensemble = ensemble
        self._limits = [StepLimit(limit) for _ in range(steps)] if limit > 0 else []

    async def acquire(self, step_index: int) -> None:
        if self._limits:
            await self._limits[step_index].acquire(self._ensemble, step_index)

    def release(self, step_index: int) -> None:
        if self._limits:
            self._limits[step_index].release()

    def release_when_done(self, task: asyncio.Task[Any], step_index: int) -> None:
        """Frees the step's slot when `task` ends, however it ends (even cancelled before it ran)."""
        if self._limits:
            limit = self._limits[step_index]
            task.add_done_callback(lambda _: limit.release())

    @property
    def enabled(self) -> bool:
        return bool(self._limits)
