"""Where a request's responses go: the sink a frontend waits on.

A sink receives the responses of one request, the last one marked final, or an error
that ends it. `SingleResponse` serves ordinary models (exactly one response);
`StreamingResponses` hands each of any number of responses to callbacks (gRPC streams);
`QueuedResponses` queues them for a coroutine to iterate. `ForwardingSink` is the base of the
sinks that wrap another one (to count, time, cache or change what passes) and add only that.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from coreserve.errors import CoreserveError, InternalError
from coreserve.types import InferenceResponse, ResponseSink

__all__ = ["ForwardingSink", "QueuedResponses", "ResponseSink", "SingleResponse", "StreamingResponses"]


class SingleResponse:
    """A sink for a request that gets exactly one response, awaited as a future."""

    __slots__ = ("future",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.future: asyncio.Future[InferenceResponse] = loop.create_future()

    @property
    def done(self) -> bool:
        return self.future.done()

    def send(self, response: InferenceResponse | None, final: bool) -> None:
        if self.future.done():
            return
        if response is None or not final:
            self.future.set_exception(
                InternalError("the model sent a partial response to a request that expects one response")
            )
            return
        self.future.set_result(response)

    def fail(self, error: CoreserveError) -> None:
        if not self.future.done():
            self.future.set_exception(error)


class StreamingResponses:
    """A sink that passes every response, and the final flag, or the error to callbacks."""

    __slots__ = ("_done", "_on_error", "_on_response")

    def __init__(
        self,
        on_response: Callable[[InferenceResponse | None, bool], None],
        on_error: Callable[[CoreserveError], None],
    ) -> None:
        self._on_response = on_response
        self._on_error = on_error
        self._done = False

    @property
    def done(self) -> bool:
        return self._done

    def send(self, response: InferenceResponse | None, final: bool) -> None:
        if self._done:
            return
        self._done = final
        self._on_response(response, final)

    def fail(self, error: CoreserveError) -> None:
        if not self._done:
            self._done = True
            self._on_error(error)


class QueuedResponses:
    """A sink whose responses a coroutine iterates: `async for response in sink.responses()`."""

    __slots__ = ("_done", "_queue")

    def __init__(self) -> None:
        self._queue: asyncio.Queue[tuple[InferenceResponse | None, bool] | CoreserveError] = asyncio.Queue()
        self._done = False

    @property
    def done(self) -> bool:
        return self._done

    @property
    def drained(self) -> bool:
        """True once `responses()` has taken the final response or the error: nothing more comes."""
        return self._done and self._queue.empty()

    def send(self, response: InferenceResponse | None, final: bool) -> None:
        if not self._done:
            self._done = final
            self._queue.put_nowait((response, final))

    def fail(self, error: CoreserveError) -> None:
        if not self._done:
            self._done = True
            self._queue.put_nowait(error)

    async def responses(self) -> AsyncIterator[InferenceResponse]:
        """Yields each response until the final one; raises the error that ends the request."""
        while True:
            item = await self._queue.get()
            if isinstance(item, CoreserveError):
                raise item
            response, final = item
            if response is not None:
                yield response
            if final:
                return


class ForwardingSink:
    """A sink that passes everything on to the sink it wraps: subclasses override what they add to."""

    __slots__ = ("_target",)

    def __init__(self, target: ResponseSink) -> None:
        self._target = target

    @property
    def done(self) -> bool:
        return self._target.done

    def send(self, response: InferenceResponse | None, final: bool) -> None:
        self._target.send(response, final)

    def fail(self, error: CoreserveError) -> None:
        self._target.fail(error)
