"""Worker threads for decoding and encoding large bodies, off the event loop.

Decompressing a body, reading the tensors of a large binary part and encoding a large
response take long enough to stall every other client of the loop (health probes included).
On a worker thread the loop gets the interpreter lock back between the codec's steps, so the
codecs keep each step short: a large response's JSON data is written a slice at a time. One
long C call holds the lock throughout, which is why large JSON bodies are parsed in a worker
process instead (`json_workers`). The cyclic garbage collector would hold it too, set off again
and again by the many objects a codec makes, so it is paused while a codec runs: nothing a
codec builds holds a cycle.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

_T = TypeVar("_T")


class _CollectorPause:
    """Pauses the cyclic garbage collector while at least one holder asks it to."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders = 0
        self._was_enabled = False

    @contextmanager
    def held(self) -> Iterator[None]:
        with self._lock:
            if self._holders == 0:
                self._was_enabled = gc.isenabled()
                gc.disable()
            self._holders += 1
        try:
            yield
        finally:
            with self._lock:
                self._holders -= 1
                if self._holders == 0 and self._was_enabled:
                    gc.enable()


_collector_pause = _CollectorPause()


class CodecThreads:
    """A small pool that runs codec functions with the garbage collector paused."""

    def __init__(self, name: str, workers: int = 2) -> None:
        # A few threads are enough: the codecs hold the GIL most of the time.
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)

    async def run(self, function: Callable[..., _T], *args: Any) -> _T:
        """Runs `function(*args)` on a worker thread and returns (or raises) its outcome."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, _paused_call, function, args)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _paused_call(function: Callable[..., _T], args: tuple[Any, ...]) -> _T:
    with _collector_pause.held():
        return function(*args)
