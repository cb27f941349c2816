"""A server's JSON worker processes, seen and held from outside: which are alive, whether
one is working, and stopping one so that whatever waits on it waits as long as a test likes."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

from coreserve.testing import ServerProcess


def worker_pids(server: ServerProcess) -> set[int]:
    """The server's JSON worker processes that are alive (not zombies)."""
    assert server.process is not None
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rpartition(")")[2].split()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[1]) == server.process.pid and stat[0] != "Z" and b"coreserve.json_worker" in command:
            found.add(int(entry.name))
    return found


def cpu_ticks(pid: int) -> int:
    """The CPU time a process has used (user and system), in clock ticks."""
    stat = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return int(stat[11]) + int(stat[12])


@contextlib.contextmanager
def stopped(pid: int) -> Iterator[None]:
    """The process stopped (SIGSTOP) throughout the block, continued after it."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)
