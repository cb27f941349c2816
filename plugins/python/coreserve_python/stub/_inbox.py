"""How a stub takes the server's messages: its main thread reads them while idle, a standby
thread while the main thread is busy running the model.

The main thread runs the model's work (`init`, `execute`, `finalize`, ...) one message at a
time, as Triton's stub does. While it waits for the next one it reads the socket itself, so
that a request reaches the model without a hand-off between threads (a queue, a wake-up and a
GIL transfer per request cost more than the model's own work on small tensors).

Some messages must be taken while the model is busy: answers to the model's BLS calls and
other requests, cancellations (`is_cancelled()`), and the end of the socket (a busy stub must
still end when its server lets it go). The standby thread takes over the socket when the model
waits for an answer (`wake`) or has been busy for STANDBY_AFTER_S, and gives it back once the
main thread is idle again; work it reads meanwhile is queued for the main thread, in order.
Messages that are not work are handled at once (`handle` returns True for them) by whichever
thread read them. Standard library only.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from coreserve_python.ipc import Channel, Message

# How long the model may run before the standby thread watches the socket for it.
STANDBY_AFTER_S = 0.002
# How often an idle standby thread looks whether the main thread has become busy: at most.
STANDBY_POLL_MAX_S = 0.05


class Inbox:
    """The server's messages for a stub's main thread; see the module's docstring."""

    def __init__(
        self,
        channel: Channel,
        handle: Callable[[Message], bool],
        on_gone: Callable[[], None],
        abandon: Callable[[], None],
    ) -> None:
        self._channel = channel
        self._handle = handle  # True: handled (not work)
        self._on_gone = on_gone  # the server went away (called once, by the thread that saw it)
        self._abandon = abandon  # the server went away while the main thread was busy
        self._reading = threading.Lock()  # held by the thread inside channel.receive()
        self._work: queue.SimpleQueue[Message | None] = queue.SimpleQueue()
        self._busy_since: float | None = None
        self._wanted = threading.Event()
        self._gone = False
        # How long the idle main thread looks for its next message before it sleeps (the
        # model's idle_spin_microseconds, set at init; see Channel.receive).
        self.idle_spin_ns = 0

    def start(self) -> None:
        threading.Thread(target=self._stand_by, name="coreserve-stub-standby", daemon=True).start()

    def next_work(self) -> Message | None:
        """The next work message (main thread only), or None once the server has gone."""
        self._busy_since = None
        while True:
            if not self._work.empty():
                queued = self._work.get()
                self._busy_since = time.monotonic() if queued is not None else None
                return queued
            with self._reading:
                if not self._work.empty():  # queued by the standby thread meanwhile
                    continue
                if self._gone:
                    return None
                message = self._receive(self.idle_spin_ns)
            if message is None:
                self._on_gone()
                return None
            if not self._handle(message):
                self._busy_since = time.monotonic()
                return message

    def wake(self) -> None:
        """The model waits for an answer from the server: someone must read the socket."""
        self._wanted.set()

    def _receive(self, spin_ns: int = 0) -> Message | None:
        try:
            message = self._channel.receive(spin_ns)
        except OSError:
            message = None  # the server's end was reset: it went away as surely as with a close
        if message is None:
            self._gone = True
        return message

    def _stand_by(self) -> None:
        poll = STANDBY_AFTER_S
        while True:
            woken = self._wanted.wait(poll)
            self._wanted.clear()
            since = self._busy_since
            if since is None or (not woken and time.monotonic() - since < STANDBY_AFTER_S):
                poll = min(2 * poll, STANDBY_POLL_MAX_S)  # idle: look less and less often
                continue
            poll = STANDBY_AFTER_S
            if not self._reading.acquire(blocking=False):
                continue
            try:
                if self._read_while_busy():
                    return
            finally:
                self._reading.release()

    def _read_while_busy(self) -> bool:
        """Reads for the main thread until it is idle; True once the server has gone."""
        while self._busy_since is not None and not self._gone:
            message = self._receive()
            if message is None:
                self._on_gone()
                self._work.put(None)
                self._abandon()
                return True
            if not self._handle(message):
                self._work.put(message)
        return self._gone
