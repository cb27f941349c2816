"""What a worker that dies leaves running: the processes it started (an installer building a
model's environment, a model's stubs) and theirs.

The supervisor makes itself their subreaper (Linux's PR_SET_CHILD_SUBREAPER), so that a dead
worker's descendants become its children rather than init's. Among its children, a worker is
one it started (its pid is known) or one whose environment names its role (`WORKER_ENV`, which
a worker takes out of its own environment, so its children do not carry it); every other child
is an orphan of a worker that died: it is killed, with the process group it leads, and reaped.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
from collections.abc import Collection

from coreserve.server.workers._role import WORKER_ENV

logger = logging.getLogger(__name__)

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Makes this process the subreaper of its descendants; False where the system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _children() -> list[int]:
    me = os.getpid()
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as stat:
                    parent = int(stat.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if parent == me:
                found.append(int(entry.name))
    return found


def _is_worker(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as environ:
            return any(item.startswith(WORKER_ENV.encode() + b"=") for item in environ.read().split(b"\0"))
    except OSError:
        return False


def end_orphans(workers: Collection[int]) -> int:
    """Kills and reaps this process's children that are no workers (`workers`: the pids of the
    workers it started); returns how many it ended."""
    ended = 0
    for pid in _children():
        if pid in workers or _is_worker(pid):
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(pid) == pid:  # an installer leads its own group: its children go too
                os.killpg(pid, signal.SIGKILL)
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        ended += 1
    if ended:
        logger.warning("ended %d process(es) that workers which died had left running", ended)
    return ended
