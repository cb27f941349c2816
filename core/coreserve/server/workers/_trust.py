"""Who may speak on the workers' internal lines, and the count of what a line refused.

Only the supervisor's children are workers. The supervisor takes a connection only from a
process it started as a worker (and a `join` only for that worker's own index); worker 0 takes
one only from a sibling, a process whose parent is its own (the supervisor). The kernel says
which process connected (SO_PEERCRED), so another process of the same user cannot pass for a
worker; other users are kept out by the socket folder's mode (0700).

A line that breaks its rules (a frame too large, one that cannot be read) is closed, alone, and
counted in `coreserve_worker_line_errors_total`.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections import Counter

_CREDENTIALS = struct.Struct("3i")  # struct ucred: pid, uid, gid
# Why a line was closed, as the metric's `reason` label says it.
STRANGER = "stranger"  # a process that is not one of the server's workers
OVERSIZED = "oversized"  # a frame whose header claims more than the line's limit
MALFORMED = "malformed"  # a frame that cannot be read


def peers_can_be_checked() -> bool:
    """Whether this system says who is at the other end of a Unix socket (Linux does)."""
    return hasattr(socket, "SO_PEERCRED")


def peer_pid(writer: asyncio.StreamWriter) -> int | None:
    """The process at the other end of a Unix socket connection (None if it cannot be told)."""
    connection = writer.get_extra_info("socket")
    if connection is None or not peers_can_be_checked():
        return None
    credentials = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDENTIALS.size)
    pid = int(_CREDENTIALS.unpack(credentials)[0])
    return pid or None


def parent_pid(pid: int) -> int | None:
    """The parent of process `pid` (None where it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            # The command name, in parentheses, may hold spaces and parentheses itself.
            return int(stat.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


class LineErrors:
    """This process's count of lines closed, by reason."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def count(self, reason: str) -> None:
        self.counts[reason] += 1

    def render(self) -> str:
        """The family in Prometheus text format (nothing until a line was closed)."""
        if not self.counts:
            return ""
        lines = [
            "# HELP coreserve_worker_line_errors_total Number of connections to the workers' internal "
            "lines closed for breaking their rules, by reason (coreserve)",
            "# TYPE coreserve_worker_line_errors_total counter",
        ]
        lines += [
            f'coreserve_worker_line_errors_total{{reason="{reason}"}} {n}'
            for reason, n in sorted(self.counts.items())
        ]
        return "\n".join(lines) + "\n"


LINE_ERRORS = LineErrors()
