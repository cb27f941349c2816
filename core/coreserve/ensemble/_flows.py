"""One ensemble request's flows, as Triton's ensemble runs them: a flow runs steps until it has
the ensemble's outputs; each response of a decoupled step starts a flow of its own, at once,
beside the others (the steps after a streaming model run as its responses come, not one
response after another). A flow that has the outputs sends them as one response of the
ensemble: the last when no other flow runs then (Triton's final flag rides on the response that
finds the pipeline drained)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Coroutine
from typing import Any, Generic, TypeVar

Result = TypeVar("Result")


class Flows(Generic[Result]):
    def __init__(self) -> None:
        self._results: asyncio.Queue[tuple[Result, bool] | Exception | None] = asyncio.Queue()
        self._running = 0
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, flow: Coroutine[Any, Any, None]) -> None:
        """Runs `flow` in a task of its own; it counts as running from now on."""
        self._running += 1
        task = asyncio.create_task(self._run(flow))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda _: flow.close())  # (one cancelled before it ran never started)

    async def _run(self, flow: Coroutine[Any, Any, None]) -> None:
        try:
            await flow
        except Exception as exc:  # the reader's to raise: the first one ends the request
            self._results.put_nowait(exc)
        finally:
            self._running -= 1
            if self._running == 0:
                self._results.put_nowait(None)

    def emit(self, result: Result) -> None:
        """A flow's result, the flow's last act: final where no other flow runs."""
        self._results.put_nowait((result, self._running == 1))

    def fail(self, error: Exception) -> None:
        """Ends the request with `error` (its client cancelled it, say)."""
        self._results.put_nowait(error)

    async def results(self) -> AsyncGenerator[tuple[Result, bool], None]:
        """Each result as it comes, with whether it is the last, until every flow has ended; the
        first error raised. Leaving the iteration cancels the flows still running."""
        try:
            while (item := await self._results.get()) is not None:
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            for task in self._tasks:
                task.cancel()
