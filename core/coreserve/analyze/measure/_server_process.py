"""The coreserve process an analysis starts, and what it costs (CPU and memory of its tree).

The server runs with `--model-control-mode explicit` on the user's repository: each
configuration is loaded through the repository API with a config override, so nothing
restarts between points. Ports are free ones on 127.0.0.1, chosen at start. Its metrics are
refreshed every METRICS_INTERVAL_MS: the GPUs' figures are read there.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
METRICS_INTERVAL_MS = 500


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class ServerProcess:
    """A `coreserve` child process serving `repository` on free loopback ports."""

    def __init__(self, repository: Path, log_path: Path, extra_args: list[str]) -> None:
        self.grpc_port = free_port()
        self.http_port = free_port()
        self.metrics_port = free_port()
        self.log_path = log_path
        command = [
            sys.executable,
            "-m",
            "coreserve",
            "--model-repository",
            str(repository),
            "--model-control-mode",
            "explicit",
            "--http-address",
            "127.0.0.1",
            "--http-port",
            str(self.http_port),
            "--grpc-address",
            "127.0.0.1",
            "--grpc-port",
            str(self.grpc_port),
            "--metrics-address",
            "127.0.0.1",
            "--metrics-port",
            str(self.metrics_port),
            "--metrics-interval-ms",
            str(METRICS_INTERVAL_MS),
            *extra_args,
        ]
        self._log = log_path.open("ab")
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_address(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        if self.alive():
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        self._log.close()

    def log_tail(self, lines: int = 20) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


@dataclass
class Usage:
    """CPU seconds a process tree has used, and its resident memory now."""

    cpu_s: float
    rss_mb: float
    at: float

    def cpu_percent_since(self, before: Usage) -> float:
        """CPU used between `before` and this reading, in percent of one core."""
        elapsed = self.at - before.at
        return 100 * (self.cpu_s - before.cpu_s) / elapsed if elapsed > 0 else 0.0


def tree_usage(pid: int) -> Usage:
    """The process `pid` and all its descendants (Python models run in stub processes), from
    /proc; zeros where /proc is not there (the report then leaves the columns empty)."""
    cpu_ticks, rss_pages = 0, 0
    for member in _tree(pid):
        try:
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
            rss = int(Path(f"/proc/{member}/statm").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # ended meanwhile
        cpu_ticks += int(fields[11]) + int(fields[12])  # utime, stime
        rss_pages += rss
    return Usage(cpu_ticks / CLOCK_TICKS, rss_pages * PAGE_SIZE / 1e6, time.monotonic())


def _tree(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found, pending = [], [pid]
    while pending:
        current = pending.pop()
        found.append(current)
        pending.extend(children.get(current, []))
    return found
