"""What a process holds that an unloaded model must give back: threads, open files, child processes."""

from __future__ import annotations

import gc
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

# Threads of pools that outlive any one model: the event loop's default executor (asyncio.to_thread).
_SHARED_THREAD_PREFIXES = ("asyncio_",)


@dataclass(frozen=True)
class Resources:
    """A snapshot of this process's threads, open file descriptors and live child processes."""

    threads: Counter[str]  # by name: instances of one model name their threads alike
    open_files: int | None  # None where /proc is not there to count them
    children: frozenset[int]

    def leaks_since(self, before: Resources) -> list[str]:
        """What this snapshot holds beyond `before`, in words (empty if nothing)."""
        leaks = []
        extra_threads = sorted((self.threads - before.threads).elements())
        if extra_threads:
            leaks.append(f"threads still running: {', '.join(extra_threads)}")
        if (
            self.open_files is not None
            and before.open_files is not None
            and self.open_files > before.open_files
        ):
            leaks.append(f"{self.open_files - before.open_files} more open file descriptors")
        extra_children = sorted(self.children - before.children)
        if extra_children:
            leaks.append(f"child processes still alive: pids {', '.join(map(str, extra_children))}")
        return leaks


def snapshot() -> Resources:
    gc.collect()  # an instance's last reference may sit in a cycle; its finalizers release files
    threads = Counter(
        thread.name for thread in threading.enumerate() if not thread.name.startswith(_SHARED_THREAD_PREFIXES)
    )
    proc = Path("/proc/self/fd")
    open_files = len(os.listdir(proc)) if proc.is_dir() else None
    return Resources(threads, open_files, frozenset(_children()))


def _children() -> list[int]:
    """Live (not zombie) child processes, read from /proc; none where there is no /proc."""
    me = os.getpid()
    found: list[int] = []
    proc = Path("/proc")
    if not proc.is_dir():
        return found
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses; split after the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == me and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def leaks_after(before: Resources, settle_s: float = 10.0) -> list[str]:
    """What is still held beyond `before`, after giving threads and processes `settle_s` to end."""
    deadline = time.monotonic() + settle_s
    while True:
        leaks = snapshot().leaks_since(before)
        if not leaks or time.monotonic() > deadline:
            return leaks
        time.sleep(0.1)
