"""Where a request's responses go: the sink a frontend waits on.

A sink receives the responses of one request, the last one marked final, or an error
that ends it. `SingleResponse` serves ordinary models (exactly one response);
`StreamingResponses` hands each of any number of responses to callbacks (gRPC streams);
`QueuedResponses` queues them for a coroutine to iterate, up to a bound on what waits.
`ForwardingSink` is the base of the sinks that wrap another one (to count, time, cache or
change what passes) and add only that.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Collection

import numpy as np

from coreserve.errors import CoreserveError, InternalError, UnavailableError
from coreserve.types import InferenceResponse, ResponseSink

__all__ = ["ForwardingSink", "QueuedResponses", "ResponseSink", "SingleResponse", "StreamingResponses"]

# What a stream's responses may hold while a network client has not taken them (one response,
# whatever its size, and the final one always wait).
MAX_WAITING_BYTES = 64 * 1024 * 1024


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
        if response is not None and response.error is not None:  # (a decoupled model's, not final)
            self.future.set_exception(response.error)
            return
        if response is None:  # (a Python model's execute() that returned None in its list, say)
            self.future.set_exception(
                InternalError("the model ended the request without a response; it expects one response")
            )
            return
        if not final:
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
    """A sink whose responses a coroutine iterates: `async for response in sink.responses()`.

    A model may answer faster than the coroutine takes its answers (a client that reads a
    stream slowly, or not at all): past `max_waiting_bytes` of outputs waiting (more than one
    response, and not the final one), the waiting responses are dropped, the request ends with
    an error that says why, and `on_overflow` is called (the caller cancels the request there).
    """

    __slots__ = ("_done", "_limit", "_on_overflow", "_queue", "_waiting_bytes")

    def __init__(
        self,
        max_waiting_bytes: int | None = None,
        on_overflow: Callable[[], object] | None = None,
    ) -> None:
        self._queue: asyncio.Queue[tuple[InferenceResponse | None, bool, int] | CoreserveError] = (
            asyncio.Queue()
        )
        self._done = False
        self._limit = max_waiting_bytes
        self._on_overflow = on_overflow
        self._waiting_bytes = 0

    @property
    def done(self) -> bool:
        return self._done

    @property
    def drained(self) -> bool:
        """True once `responses()` has taken the final response or the error: nothing more comes."""
        return self._done and self._queue.empty()

    def send(self, response: InferenceResponse | None, final: bool) -> None:
        if self._done:
            return
        size = 0
        if self._limit is not None and response is not None:
            size = output_bytes(response)
            if not final and not self._queue.empty() and self._waiting_bytes + size > self._limit:
                self._overflow(size)
                return
            self._waiting_bytes += size
        self._done = final
        self._queue.put_nowait((response, final, size))

    def fail(self, error: CoreserveError) -> None:
        if not self._done:
            self._done = True
            self._queue.put_nowait(error)

    def _overflow(self, size: int) -> None:
        waiting = self._queue.qsize()
        while not self._queue.empty():
            self._queue.get_nowait()
        self.fail(
            UnavailableError(
                f"the responses were taken too slowly: {waiting + 1} responses of "
                f"{self._waiting_bytes + size} bytes waited (at most {self._limit} bytes); the request "
                "was cancelled"
            )
        )
        if self._on_overflow is not None:
            self._on_overflow()

    async def responses(self) -> AsyncIterator[InferenceResponse]:
        """Yields each response until the final one; raises the error that ends the request."""
        async for response, _ in self.flagged():
            if response is not None:
                yield response

    async def flagged(self) -> AsyncIterator[tuple[InferenceResponse | None, bool]]:
        """`responses`, each with whether it carried the final flag; a final flag sent alone
        comes as (None, True)."""
        while True:
            item = await self._queue.get()
            if isinstance(item, CoreserveError):
                raise item
            response, final, size = item
            self._waiting_bytes -= size
            yield response, final
            if final:
                return


def output_bytes(response: InferenceResponse, leaving_out: Collection[str] = ()) -> int:
    """What a response's outputs hold (but those named in `leaving_out`: sent elsewhere, into
    shared memory), BYTES elements by their lengths."""
    total = 0
    for name, array in response.outputs.items():
        if name in leaving_out:
            continue
        if array.dtype == np.object_:
            total += sum(len(item) if isinstance(item, bytes | str) else 8 for item in array.flat)
        else:
            total += array.nbytes
    return total


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
