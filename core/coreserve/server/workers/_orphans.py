"""What a worker that dies leaves running: the processes it started (an installer building a
model's environment) and theirs.

Each worker leads a session of its own (the supervisor starts it so), which what it starts
shares unless it leaves it: an installer leads a process group of its own inside it, while a
model's stubs (which die with their worker by themselves) and a daemon a model starts leave it.
The supervisor makes itself the subreaper of its descendants (Linux's PR_SET_CHILD_SUBREAPER),
so that a dead worker's descendants become its children rather than init's. When a worker dies,
its children of that worker's session are killed, with the process groups they lead; children
that are no workers and have exited are reaped, never waited for.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
from collections.abc import Collection

logger = logging.getLogger(__name__)

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Makes this process the subreaper of its descendants; False where the system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _children() -> dict[int, int]:
    """This process's children: pid -> session id."""
    me = os.getpid()
    found = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as stat:
                    fields = stat.read().rsplit(b")", 1)[1].split()  # past the command's name
                parent, session = int(fields[1]), int(fields[3])
            except (OSError, IndexError, ValueError):
                continue
            if parent == me:
                found[int(entry.name)] = session
    return found


def end_orphans(dead: int | None, workers: Collection[int]) -> None:
    """Kills this process's children that are no workers (`workers`: their pids) and belong to
    the session of worker `dead` (its pid: it died), or to any session where `dead` is None (the
    server stops); then reaps those that have exited."""
    ended = 0
    for pid, session in _children().items():
        if pid in workers or (dead is not None and session != dead):
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(pid) == pid:  # an installer leads its own group: its children go too
                os.killpg(pid, signal.SIGKILL)
            os.kill(pid, signal.SIGKILL)
            ended += 1
    if ended:
        logger.warning("ended %d process(es) that a worker which died had left running", ended)
    reap_orphans(workers)


def reap_orphans(workers: Collection[int]) -> None:
    """Reaps the children that are no workers and have exited (without waiting for any)."""
    for pid in _children():
        if pid not in workers:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
