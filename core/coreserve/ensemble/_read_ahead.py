"""A decoupled step's responses, read ahead in a task of their own, so that an ensemble can tell,
without waiting, whether the step has ended: Triton's ensemble puts the final flag on its last
response when its pipeline has drained by then, and a client that waits for that flag (without
asking for an empty final response) must get it there."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Generic, TypeVar

Item = TypeVar("Item")


@dataclass(frozen=True)
class _End:
    error: Exception | None


class ReadAhead(Generic[Item]):
    """Iterates `responses` as they come, read by a task; closing the iteration stops it."""

    def __init__(self, responses: AsyncIterator[Item]) -> None:
        self._queue: asyncio.Queue[Item | _End] = asyncio.Queue()
        self._ended_well = False
        self._task = asyncio.create_task(self._read(responses))

    async def _read(self, responses: AsyncIterator[Item]) -> None:
        try:
            async for item in responses:
                self._queue.put_nowait(item)
        except Exception as exc:  # (the reader's to raise, where it has got so far)
            self._queue.put_nowait(_End(exc))
            return
        self._ended_well = True
        self._queue.put_nowait(_End(None))

    @property
    def drained(self) -> bool:
        """Whether the responses ended without an error and every one has been taken."""
        return self._ended_well and self._queue.qsize() == 1

    async def items(self) -> AsyncIterator[Item]:
        try:
            while True:
                item = await self._queue.get()
                if isinstance(item, _End):
                    if item.error is not None:
                        raise item.error
                    return
                yield item
        finally:
            self._task.cancel()  # (where the reader left early: the step's request is cancelled)
