"""Clients that keep sending from background threads while a test changes the server."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, Self, TypeVar

import tritonclient.http as httpclient

T = TypeVar("T")


class ClientThreads(Generic[T]):
    """Calls `send(client)` back to back on `count` threads, each with an HTTP client of its
    own, from the `with` block's start to its end (at most `seconds`), recording every outcome:
    `answers` (what `send` returned), each thread's own in `by_thread` (in the order it sent:
    threads append to `answers` in whatever order they wake), and `failures`."""

    def __init__(
        self,
        url: str,
        send: Callable[[httpclient.InferenceServerClient], T],
        count: int = 2,
        seconds: float = 60.0,
    ) -> None:
        self._url, self._send, self._seconds = url, send, seconds
        self.answers: list[T] = []
        self.by_thread: list[list[T]] = [[] for _ in range(count)]
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(mine,)) for mine in self.by_thread]

    def _run(self, mine: list[T]) -> None:
        deadline = time.monotonic() + self._seconds
        with httpclient.InferenceServerClient(self._url, network_timeout=30) as client:
            while not self._stop.is_set() and time.monotonic() < deadline:
                try:
                    answer = self._send(client)
                except Exception as exc:  # every failure counts, whatever its kind
                    with self._lock:
                        self.failures.append(str(exc))
                    continue
                with self._lock:
                    self.answers.append(answer)
                    mine.append(answer)

    def last(self) -> T | None:
        with self._lock:
            return self.answers[-1] if self.answers else None

    def __enter__(self) -> Self:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=self._seconds)
