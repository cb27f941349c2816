"""CPU time spent by the processes of a benchmark: a server, its threads and worker processes,
and the load generators (Linux /proc and rusage). Benchmarks take it before and after a trial
and divide the difference by the requests served."""

from __future__ import annotations

import os
import resource
from pathlib import Path


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) each thread of process `pid` has used, from /proc (Linux;
    empty elsewhere)."""
    ticks = os.sysconf("SC_CLK_TCK")
    spent = {}
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as file:
                fields = file.read().rpartition(")")[2].split()
        except OSError:
            continue  # the thread ended meanwhile
        spent[int(tid)] = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return spent


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system, every thread) process `pid` has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    """CPU seconds used by this process's waited-for child processes (load generators)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds process `pid` and its living descendants (a server's worker processes, such
    as Python stubs) have used so far (Linux /proc)."""
    children: dict[int, list[int]] = {}  # by parent pid
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue  # it ended meanwhile
            children.setdefault(int(fields[1]), []).append(int(entry))
    total, pending = 0.0, [pid]
    while pending:
        current = pending.pop()
        try:
            total += cpu_seconds(current)
        except OSError:
            continue  # it ended meanwhile
        pending.extend(children.get(current, ()))
    return total


def load_generator_cpu_seconds() -> float:
    """CPU seconds this process (an in-process load generator) and its waited-for children (wrk,
    h2load, perf_analyzer) have used so far."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime + children_cpu_seconds()
