"""Where a request's responses go: the sink a frontend waits on.

A sink receives the responses of one request, the last one marked final, or an error
that ends it. `SingleResponse` serves ordinary models (exactly one response); a streaming
sink for decoupled models delivers many through the same interface.
"""

from __future__ import annotations

import asyncio

from coreserve.errors import CoreserveError, InternalError
from coreserve.types import InferenceResponse, ResponseSink

__all__ = ["ResponseSink", "SingleResponse"]


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
