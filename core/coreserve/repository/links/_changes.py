"""Changes of models linked through ensembles: which models a change touches, and one change
at a time over them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable, Mapping

logger = logging.getLogger(__name__)


def linked(start: Iterable[str], uses: Mapping[str, Collection[str]]) -> set[str]:
    """The models `start` names and those linked to them through ensembles, both ways (`uses`:
    the steps of each ensemble, by name)."""
    neighbours: dict[str, set[str]] = {}
    for ensemble, steps in uses.items():
        for step in steps:
            neighbours.setdefault(ensemble, set()).add(step)
            neighbours.setdefault(step, set()).add(ensemble)
    found = set(start)
    unexplored = list(found)
    while unexplored:
        for other in neighbours.get(unexplored.pop(), set()) - found:
            found.add(other)
            unexplored.append(other)
    return found


class RelatedChanges:
    """Changes through the repository API run one after the other where they touch linked models
    (an ensemble and the models it uses), as Triton's do, and at once otherwise: an unload that
    takes an ensemble down must not meet a load that brings it back."""

    def __init__(self) -> None:
        self._busy: set[str] = set()
        self._done = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def holding(
        self, change: str, names: Callable[[], Awaitable[set[str]]], unheld: bool = False
    ) -> AsyncIterator[None]:
        """Runs the block once no other change holds any of the models `names` gives (asked
        again after each wait: the models linked change with the changes); `unheld`: at once,
        holding nothing (a change a model asks for, which the change that runs it may hold)."""
        if unheld:
            yield
            return
        while True:
            held = await names()  # (outside the lock: it may read the repository)
            async with self._done:
                if not held & self._busy:
                    self._busy |= held
                    break
                logger.info("the %s waits for a change of the models linked to it", change)
                await self._done.wait()
        try:
            yield
        finally:
            async with self._done:
                self._busy -= held
                self._done.notify_all()
