"""Order: `preserve_ordering` (responses leave in the order their requests were batched), and
requests queued again by their age.

Batches may finish out of order on several instances; each batch's responses are held until
every earlier batch has released its own.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from coreserve.errors import CoreserveError
from coreserve.types import InferenceRequest, InferenceResponse, ResponseSink


class HeldSink:
    """Records what is sent to a request's sink and replays it on release; what comes after
    the release (a request answered after its execution, wrapped meanwhile) goes straight on."""

    __slots__ = ("_calls", "_done", "_released", "_target")

    def __init__(self, target: ResponseSink) -> None:
        self._target = target
        self._calls: list[tuple[InferenceResponse | None, bool] | CoreserveError] = []
        self._done = False
        self._released = False

    @property
    def done(self) -> bool:
        return self._done

    def send(self, response: InferenceResponse | None, final: bool) -> None:
        self._done = self._done or final
        if self._released:
            self._target.send(response, final)
        else:
            self._calls.append((response, final))

    def fail(self, error: CoreserveError) -> None:
        self._done = True
        if self._released:
            self._target.fail(error)
        else:
            self._calls.append(error)

    @property
    def target(self) -> ResponseSink:
        """The sink this one holds responses for."""
        return self._target

    def release(self) -> None:
        self._released = True
        for call in self._calls:
            if isinstance(call, CoreserveError):
                self._target.fail(call)
            else:
                self._target.send(*call)
        self._calls.clear()


class OrderedRelease:
    """Hands out turns in batch order; a turn's responses wait for the turns before it."""

    def __init__(self) -> None:
        self._last: asyncio.Future[None] | None = None

    @asynccontextmanager
    async def turn(self, batch: Sequence[InferenceRequest]) -> AsyncIterator[None]:
        previous = self._last
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._last = mine
        held = []
        for request in batch:
            if request.sink is not None:
                sink = HeldSink(request.sink)
                request.sink = sink
                held.append((request, sink))
        try:
            yield
        finally:
            if previous is not None:
                await asyncio.shield(previous)
            for request, sink in held:
                sink.release()
                if request.sink is sink:
                    request.sink = sink.target
            mine.set_result(None)


def unhold(request: InferenceRequest) -> None:
    """Gives a request its own sink back from a turn's HeldSink: one queued again to be batched
    anew answers in that batch's turn, not through this one's, which is released once."""
    if isinstance(request.sink, HeldSink):
        request.sink = request.sink.target


def insert_by_age(queue: deque[InferenceRequest], request: InferenceRequest) -> None:
    """Inserts `request` into `queue` (oldest first) behind every request queued before it."""
    younger = (position for position, queued in enumerate(queue) if queued.queued_ns > request.queued_ns)
    queue.insert(next(younger, len(queue)), request)
