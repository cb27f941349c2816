"""The server's wait for a stub's answer, without sleeping where it serves one request at a time.

Serving one request at a time, the server sends an execution to the stub and its event loop
goes to sleep until the answer comes; on a virtual machine that sleep and wake-up cost about
as much as a small model's execute. Where the server serves one request at a time, the loop
instead looks for the answer for up to the model's `idle_spin_microseconds` before it goes
back to sleep, yielding its core at each look: when the answer comes in that time, the loop
finds it ready instead of being woken for it.

A request that arrives while the loop spins waits for the answer, so the loop spins only
where none does (ServerActivity):
- an execution is serial when no frontend read a client's bytes between its sending and its
  answer (the bytes of a client that sends during a spin are read as soon as it ends, before
  the answer is taken);
- the loop spins after a streak of serial executions in a row (`SERIAL_STREAK` at first), and
  only when the execution just sent is all the server has to do (one request queued or
  executing, `ServerActivity.pending_requests()`: no request of another model, a BLS call or
  an in-process client), so a server whose clients' requests overlap the executions never
  spins, and pays one counter read per execution;
- a client that sent while the loop spun doubles the streak needed (up to `MAX_STREAK`), and
  each spin no client waited for takes one off again: with two clients on one instance the
  loop spins seldom (a fixed streak cost those two clients more than no spin at all), with
  one it spins for every execution;
- after a spin that ran out, the next ones are left out, twice as many after each miss in a
  row up to `MAX_SKIPPED`, so a model slower than the spin seldom pays for it.
"""

from __future__ import annotations

import os
import select
import time

from coreserve.backend import ServerActivity

SERIAL_STREAK = 8
MAX_SKIPPED = 64
MAX_STREAK = 4096


class ReplySpin:
    """Spins on one stub's socket after an execution is sent (on the event loop's thread)."""

    def __init__(self, fd: int, spin_ns: int, activity: ServerActivity) -> None:
        self._poller = select.poll()
        self._poller.register(fd, select.POLLIN)
        self._spin_ns = spin_ns
        self._activity = activity
        self._serial = 0  # serial executions in a row
        self._streak = SERIAL_STREAK  # how many make the next one spin
        self._spun = False  # whether the loop spun for the execution in flight
        self._reads = 0  # the frontends' reads when the last execution was sent
        self._skipped = 1  # spins left out after the next miss
        self._to_skip = 0

    def after_send(self) -> None:
        """Called once an execution is written: looks for the answer until it is there or the
        spin is over, where the executions before were serial."""
        activity = self._activity
        self._spun = False
        if self._serial >= self._streak and activity.pending_requests() == 1:
            if self._to_skip:
                self._to_skip -= 1
            else:
                self._spin()
                self._spun = True
        self._reads = activity.frontend_reads()

    def answered(self) -> None:
        """Called once the stub's answer to the execution is taken."""
        if self._activity.frontend_reads() == self._reads:
            self._serial += 1
            if self._spun and self._streak > SERIAL_STREAK:
                self._streak -= 1
        else:
            self._serial = 0
            if self._spun:  # a client sent while the loop spun: it waited
                self._streak = min(2 * self._streak, MAX_STREAK)

    def _spin(self) -> None:
        deadline = time.perf_counter_ns() + self._spin_ns
        poll = self._poller.poll
        while not poll(0):
            if time.perf_counter_ns() >= deadline:
                self._to_skip = self._skipped
                self._skipped = min(2 * self._skipped, MAX_SKIPPED)
                return
            os.sched_yield()  # a thread waiting for this core (the stub's, on one core) comes first
        self._skipped = 1
