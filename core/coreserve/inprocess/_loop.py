"""The event loop thread that an in-process server runs on, and how other threads wait on it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")
_END = object()  # after the last item of an iterator handed across


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # the CLI falls back the same way
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class LoopThread:
    """A daemon thread running one event loop until `stop()`; coroutines are handed to it.

    Daemon, so that a program that forgets `stop()` can still exit (models are then not
    unloaded cleanly: `with coreserve.Server(...)` is the way to be sure).
    """

    def __init__(self, name: str) -> None:
        self.loop = _new_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self._finish()

    def _finish(self) -> None:
        """What asyncio.run does at its end: cancel leftover tasks, close generators and executor."""
        loop = self.loop
        leftover = asyncio.all_tasks(loop)
        for task in leftover:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*leftover, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())

    def in_loop_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def submit(self, work: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedules `work` on the loop; the future is safe to wait on from any other thread."""
        if not self._thread.is_alive():
            work.close()
            raise RuntimeError("this coreserve.Server is stopped")
        return asyncio.run_coroutine_threadsafe(work, self.loop)

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        """Runs `work` on the loop and blocks the calling thread until it returns or raises."""
        if self.in_loop_thread():
            # Blocking here would wait for the loop that this very call keeps busy.
            work.close()
            raise RuntimeError(
                "a blocking coreserve.Server method was called on the server's own event loop; "
                "use the async_* methods there"
            )
        return wait(self.submit(work))

    async def call(self, work: Coroutine[Any, Any, T]) -> T:
        """Awaits, on the caller's event loop, `work` run on this loop; cancelling cancels it."""
        return await asyncio.wrap_future(self.submit(work))

    async def across(self, items: AsyncIterator[T]) -> AsyncIterator[T]:
        """Iterates, on the caller's event loop, an async iterator that runs on this loop.

        Leaving early (break, cancellation) stops the iterator on this loop, whose cleanup
        then runs there (a request's stream cancels its request).
        """
        caller = asyncio.get_running_loop()
        received: asyncio.Queue[object] = asyncio.Queue()
        pump = self.submit(_pump(items, lambda item: caller.call_soon_threadsafe(received.put_nowait, item)))
        try:
            while (item := await received.get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                yield item  # type: ignore[misc]  # what `items` yielded
        finally:
            pump.cancel()  # nothing once the iterator ended

    def iterate(self, items: AsyncIterator[T]) -> Iterator[T]:
        """`across` for a thread without an event loop: a blocking iterator."""
        received: queue.SimpleQueue[object] = queue.SimpleQueue()
        pump = self.submit(_pump(items, received.put))
        try:
            while (item := received.get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                yield item  # type: ignore[misc]
        finally:
            pump.cancel()

    def stop(self) -> None:
        """Stops the loop once what runs on it returns, joins the thread and closes the loop."""
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            if self.in_loop_thread():
                return  # the thread closes nothing of itself; a later stop() from outside does
            self._thread.join()
        if not self.loop.is_closed():
            self.loop.close()


async def _pump(items: AsyncIterator[Any], deliver: Callable[[object], object]) -> None:
    """Hands each item to `deliver` (which passes it to another thread), then `_END` or the error."""
    try:
        async for item in items:
            deliver(item)
    except Exception as exc:  # raised again in the caller's thread
        deliver(exc)
        return
    finally:
        aclose = getattr(items, "aclose", None)
        if aclose is not None:  # a generator left early runs its cleanup here, on its own loop
            await aclose()
    deliver(_END)


def wait(future: concurrent.futures.Future[T]) -> T:
    """The future's result; if the waiting thread is interrupted (Ctrl-C), the work is cancelled."""
    try:
        return future.result()
    except BaseException:
        future.cancel()
        raise
