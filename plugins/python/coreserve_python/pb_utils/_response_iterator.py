"""`ResponseIterator` of `triton_python_backend_utils`: the responses of a decoupled BLS call."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Generic, Protocol, TypeVar

# pb_utils' InferenceResponse (`inference`, which imports this module).
Response = TypeVar("Response")
Response_co = TypeVar("Response_co", covariant=True)


class _ResponseSource(Protocol[Response_co]):
    """The responses of one decoupled BLS call, as the stub delivers them."""

    def next(self) -> Response_co | None: ...

    async def next_async(self) -> Response_co | None: ...

    def cancel(self) -> None: ...


class ResponseIterator(Generic[Response]):
    """The responses of a decoupled BLS call (`exec(decoupled=True)`), as Triton's iterator.

    `for` waits for each response in turn; `async for` waits without blocking the event loop
    of an `async def execute`. A final flag the model sent alone is an empty last response, as
    on Triton. `cancel()` asks the server to stop the call. Once every response came, iterating
    again replays them from the first, as Triton's iterator does.
    """

    def __init__(self, source: _ResponseSource[Response]) -> None:
        self._source = source
        self._done = False
        self._responses: list[Response] = []
        self._index = 0  # of the next response a replay gives

    def __iter__(self) -> Iterator[Response]:
        self._restart()
        return self

    def __next__(self) -> Response:
        if self._done:
            return self._replayed(StopIteration)
        return self._kept(self._source.next(), StopIteration)

    def __aiter__(self) -> AsyncIterator[Response]:
        self._restart()
        return self

    async def __anext__(self) -> Response:
        if self._done:
            return self._replayed(StopAsyncIteration)
        return self._kept(await self._source.next_async(), StopAsyncIteration)

    def _restart(self) -> None:
        if self._done and self._index >= len(self._responses):
            self._index = 0

    def _kept(self, response: Response | None, stop: type[Exception]) -> Response:
        if response is None:
            self._done = True
            self._index = len(self._responses)
            raise stop
        self._responses.append(response)
        return response

    def _replayed(self, stop: type[Exception]) -> Response:
        if self._index >= len(self._responses):
            raise stop
        self._index += 1
        return self._responses[self._index - 1]

    def cancel(self) -> None:
        """Asks the server to cancel the call; the responses still due end early."""
        self._source.cancel()
