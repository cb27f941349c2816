"""Host memory of the loaded models: measuring it, and the budget `--model-memory-budget` sets.

A model's memory is what the resident set of the server and of its child processes (the
Python backend's stub processes) grew by while the model loaded, read from /proc. The budget
bounds the sum of the loaded models' measured sizes; the server's own memory (the interpreter,
the frontends, the libraries) is not counted against it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from coreserve.errors import UnavailableError

# Decimal and binary units, as `--model-memory-budget` reads them (case does not matter).
_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_AMOUNT = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")
_PERCENT = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*%\s*$")
_PROC = Path("/proc")


class MemoryBudgetError(ValueError):
    """A `--model-memory-budget` value that cannot be used; the message says why."""


def parse_memory_budget(text: str, total: int | None = None) -> int:
    """The budget in bytes that `text` names: BYTES with an optional unit (2GB, 512MB, 1.5GiB)
    or PERCENT of the host's memory (40%); `total` is that memory (by default /proc/meminfo's
    MemTotal). Raises MemoryBudgetError for zero, a percentage past 100 or a malformed value."""
    percent = _PERCENT.match(text)
    if percent is not None:
        share = float(percent[1])
        if not 0 < share <= 100:
            raise MemoryBudgetError(
                f"a model memory budget in percent must be above 0 and at most 100, got '{text}'"
            )
        host = total if total is not None else host_memory()
        return int(host * share / 100)
    amount = _AMOUNT.match(text)
    if amount is None or amount[2].lower() not in _UNITS:
        raise MemoryBudgetError(
            f"expected a model memory budget as BYTES (e.g. 2GB, 512MB, 1GiB) or PERCENT of the host's "
            f"memory (e.g. 40%), got '{text}'"
        )
    budget = int(float(amount[1]) * _UNITS[amount[2].lower()])
    if budget <= 0:
        raise MemoryBudgetError(f"a model memory budget must be above 0 bytes, got '{text}'")
    return budget


def host_memory() -> int:
    """The host's memory in bytes (MemTotal)."""
    for line in (_PROC / "meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise MemoryBudgetError("cannot read the host's memory size from /proc/meminfo")


def process_tree_rss(pid: int | None = None) -> int:
    """The resident memory in bytes of a process (this one by default) and all its descendants."""
    root = os.getpid() if pid is None else pid
    parents: dict[int, int] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # it exited meanwhile
            continue
        # The command name (in parentheses) may hold blanks: the fields start after its ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        parents[int(entry.name)] = int(fields[1])
    tree = {root}
    grew = True
    while grew:  # (bounded: each pass adds a process or ends)
        grew = False
        for child, parent in parents.items():
            if parent in tree and child not in tree:
                tree.add(child)
                grew = True
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for member in tree:
        try:
            total += int((_PROC / str(member) / "statm").read_text().split()[1]) * page
        except (OSError, IndexError, ValueError):
            continue
    return total


def megabytes(size: int) -> str:
    """A size in bytes for a message, in MB (10^6 bytes)."""
    return f"{size / 1e6:.1f} MB"


class ModelMemoryBudgetError(UnavailableError):
    """A model cannot load: with it, the loaded models would use more than the budget."""


class ModelMemory:
    """The measured memory of each loaded model, and the budget their sum must stay within."""

    def __init__(self, budget: int | None = None) -> None:
        self.budget = budget  # bytes; None: no budget
        self.loaded: dict[str, int] = {}  # by model key, for the models loaded now
        self._measured: dict[str, int] = {}  # by model key, at its last load (kept after unloading)

    def used(self) -> int:
        return sum(self.loaded.values())

    def expected(self, key: str) -> int | None:
        """The size `key` had at its last load (None: never measured)."""
        return self._measured.get(key)

    def measured(self, key: str, size: int) -> None:
        """Notes what a model's load took (for its next load), whether it stays loaded or not."""
        self._measured[key] = size

    def record(self, key: str, size: int) -> None:
        """Counts a loaded model's measured size as used."""
        self.loaded[key] = self._measured[key] = size

    def release(self, key: str) -> None:
        self.loaded.pop(key, None)

    def over(self, extra: int = 0) -> bool:
        return self.budget is not None and self.used() + extra > self.budget

    def refusal(self, name: str, expected: int | None, why: str) -> ModelMemoryBudgetError:
        """The error of a load the budget has no room for, with the budget, the usage and the model."""
        assert self.budget is not None
        size = f"{megabytes(expected)} at its last load" if expected is not None else "measured now"
        return ModelMemoryBudgetError(
            f"cannot load model '{name}' ({size}) within the model memory budget of "
            f"{megabytes(self.budget)}: loaded models use {megabytes(self.used())}, and {why}"
        )
