"""How a request counts when it ends after its execution returned (a decoupled model's, or
one an ordinary model deferred)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from coreserve.errors import CoreserveError
from coreserve.responses import ForwardingSink
from coreserve.types import InferenceRequest, InferenceResponse, ResponseSink

# Called once with None (a success) or the failure reason ("CANCELED", "BACKEND").
Settle = Callable[[str | None], None]


class StreamOutcome(ForwardingSink):
    """The sink of a request answered after its execution: settles its statistics once it ends.

    A decoupled model may answer after execute() returned (from a thread of its own), and so
    may an ordinary model for a request it deferred (`Responder.defer`), so the execution
    cannot say how the request went. It counts when its final response or error is
    delivered, or as CANCELED as soon as it is cancelled: a model may never answer a request
    its client gave up. Responses sent after the cancellation are dropped (nobody waits for
    them); a final one still closes the sink, without its payload.
    """

    __slots__ = ("_request", "_settle", "_unregister")

    def __init__(self, request: InferenceRequest, target: ResponseSink) -> None:
        super().__init__(target)
        self._request = request
        self._settle: Settle | None = None
        self._unregister: Callable[[], None] | None = None

    def defer(self, settle: Settle) -> None:
        """Calls `settle` once the request ends (at once if it was cancelled already)."""
        if self._request.is_cancelled():
            settle("CANCELED")
            return
        self._settle = settle
        self._unregister = self._request.on_cancel(lambda: self._end("CANCELED"))

    def send(self, response: InferenceResponse | None, final: bool) -> None:
        if self._request.is_cancelled():
            if not final:
                return
            response = None
        self._target.send(response, final)
        if final:
            self._end(None)

    def fail(self, error: CoreserveError) -> None:
        self._target.fail(error)
        self._end("CANCELED" if self._request.is_cancelled() else "BACKEND")

    def _end(self, reason: str | None) -> None:
        settle, self._settle = self._settle, None
        if self._unregister is not None:
            self._unregister()
            self._unregister = None
        if settle is not None:
            settle(reason)


class OpenStreams:
    """How many of a scheduler's requests are still answered after their execution returned.

    Closing the scheduler waits for them before it closes the instances, as a Triton model
    stays loaded until its last response is sent: a model's finalize() must not run while it
    still answers. Use it on the event loop thread.
    """

    __slots__ = ("_count", "_none")

    def __init__(self) -> None:
        self._count = 0
        self._none = asyncio.Event()
        self._none.set()

    def __len__(self) -> int:
        return self._count

    def opened(self) -> None:
        self._count += 1
        self._none.clear()

    def closed(self) -> None:
        self._count -= 1
        if not self._count:
            self._none.set()

    async def ended(self) -> None:
        """Returns once none is open."""
        await self._none.wait()
