"""Memory of the loaded models: measuring it, and the budgets `--model-memory-budget` sets.

A model's host memory is what the resident set of the server and of its child processes (the
Python backend's stub processes) grew by while the model loaded, read from /proc; its memory
on a GPU is what that GPU's used memory grew by meanwhile, read through NVML (`_gpu`).
A budget bounds the sum of the loaded models' measured sizes in its place (the host, or one
GPU); the server's own memory (the interpreter, the frontends, the libraries, a CUDA context
made before) is not counted against it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class Percent:
    """A GPU's budget as a share of its memory, in bytes once NVML has said how much it has."""

    share: float  # above 0, at most 100

    def of(self, total: int) -> int:
        return int(total * self.share / 100)


@dataclass(frozen=True)
class MemoryBudgets:
    """What `--model-memory-budget` sets: the host's budget in bytes, and each GPU's."""

    host: int | None = None  # None: no budget for the host
    gpus: dict[int, int | Percent] = field(default_factory=dict)  # by CUDA id (see `_gpu`)

    def __bool__(self) -> bool:
        return self.host is not None or bool(self.gpus)


def parse_memory_budgets(values: Sequence[str], total: int | None = None) -> MemoryBudgets:
    """The budgets that `--model-memory-budget`'s values name: one for the host (see
    `parse_memory_budget`) and any number of `gpu:<id>=BYTES|PERCENT`, one per GPU."""
    host: int | None = None
    gpus: dict[int, int | Percent] = {}
    for text in values:
        if text.strip().lower().startswith("gpu:"):
            device, equals, amount = text.strip()[4:].partition("=")
            if not equals or not device.strip().isdigit():
                raise MemoryBudgetError(
                    "expected a GPU's model memory budget as gpu:<id>=BYTES or gpu:<id>=PERCENT "
                    f"(e.g. gpu:0=8GB, gpu:0=60%), got '{text}'"
                )
            if int(device) in gpus:
                raise MemoryBudgetError(f"the model memory budget of GPU {int(device)} is given twice")
            share = _parse_percent(amount, text)
            gpus[int(device)] = (
                Percent(share)
                if share is not None
                else _parse_bytes(
                    amount, text, "(e.g. gpu:0=8GB) or PERCENT of the GPU's memory (e.g. gpu:0=60%)"
                )
            )
        else:
            if host is not None:
                raise MemoryBudgetError(f"the host's model memory budget is given twice (again as '{text}')")
            host = parse_memory_budget(text, total)
    return MemoryBudgets(host, gpus)


def parse_memory_budget(text: str, total: int | None = None) -> int:
    """The budget in bytes that `text` names: BYTES with an optional unit (2GB, 512MB, 1.5GiB)
    or PERCENT of the host's memory (40%); `total` is that memory (by default /proc/meminfo's
    MemTotal). Raises MemoryBudgetError for zero, a percentage past 100 or a malformed value."""
    share = _parse_percent(text, text)
    if share is not None:
        return Percent(share).of(total if total is not None else host_memory())
    return _parse_bytes(text, text, "(e.g. 2GB, 512MB, 1GiB) or PERCENT of the host's memory (e.g. 40%)")


def _parse_percent(amount_text: str, text: str) -> float | None:
    """The share that `amount_text` names in percent (None: it names none)."""
    percent = _PERCENT.match(amount_text)
    if percent is None:
        return None
    share = float(percent[1])
    if not 0 < share <= 100:
        raise MemoryBudgetError(
            f"a model memory budget in percent must be above 0 and at most 100, got '{text}'"
        )
    return share


def _parse_bytes(amount_text: str, text: str, examples: str) -> int:
    amount = _AMOUNT.match(amount_text)
    if amount is None or amount[2].lower() not in _UNITS:
        raise MemoryBudgetError(f"expected a model memory budget as BYTES {examples}, got '{text}'")
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
    """The measured memory of each loaded model in one place (the host, or a GPU), and the
    budget their sum must stay within."""

    def __init__(self, budget: int | None = None, place: str = "") -> None:
        self.budget = budget  # bytes; None: no budget
        self.place = place  # "": the host; "GPU 0": that GPU
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
        budget = f"{self.place}'s model memory budget" if self.place else "the model memory budget"
        return ModelMemoryBudgetError(
            f"cannot load model '{name}' ({size}) within {budget} of "
            f"{megabytes(self.budget)}: loaded models use {megabytes(self.used())}, and {why}"
        )
