"""What a benchmark reports: its tables, printed as it ends, and its results file.

Every script writes `benchmarks/results/<script>.json` in one shape, which `tables.py` renders
as markdown:

    {
      "script": "batching",                    # the script's name, without .py
      "date": "2026-11-27T01:31:05+0000",      # when it ended, local time with its offset
      "machine": {"description": "2 CPUs (…), 7.8 GiB, Linux 6.1", "cpus": 2, …},
      "parameters": {"seconds": 8, "trials": 3},   # its command-line arguments
      "tables": [{"title": "…", "columns": ["…"], "rows": [["…", 1.5]]}],
      "data": {…}                              # the script's own details: rounds, ratios, samples
    }

Rows hold the values as measured (numbers stay numbers); they are formatted when printed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Any

# Where results files go: benchmarks/results, or $BENCHMARK_RESULTS (a smoke run's figures kept apart).
RESULTS = Path(os.environ.get("BENCHMARK_RESULTS") or Path(__file__).resolve().parents[1] / "results")
# Names the machine in the results where its hardware does not say enough ("a shared 2-core VM").
MACHINE_VARIABLE = "BENCHMARK_MACHINE"


@dataclass
class Table:
    """One table of a benchmark's results: a title, column names and rows of values."""

    title: str
    columns: list[str]
    rows: list[list[object]]


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> Table:
    """Prints a table aligned for a terminal and returns it, for write_results."""
    table = Table(title, [str(c) for c in columns], [list(row) for row in rows])
    cells = [table.columns] + [[format_value(v) for v in row] for row in table.rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    print(f"\n{title}")
    for index, row in enumerate(cells):
        print(
            "  ".join(
                cell.rjust(width) if i else cell.ljust(width)
                for i, (cell, width) in enumerate(zip(row, widths, strict=True))
            )
        )
        if index == 0:
            print("  ".join("-" * width for width in widths))
    return table


def format_value(value: object) -> str:
    """A cell as the tables show it: floats with thousands separators, two decimals below 100."""
    if isinstance(value, float):
        return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def machine() -> dict[str, object]:
    """The machine a result was measured on: a description and the facts it is made of."""
    cpus = os.cpu_count()
    cpu_model = _proc_field("/proc/cpuinfo", "model name")
    memory_kib = _proc_field("/proc/meminfo", "MemTotal")
    memory_gib = round(int(memory_kib.split()[0]) / 1024**2, 1) if memory_kib else None
    described = f"{cpus} CPUs" + (f" ({cpu_model})" if cpu_model else "")
    if memory_gib is not None:
        described += f", {memory_gib} GiB"
    described += f", {platform.system()} {platform.release()}"
    return {
        "description": os.environ.get(MACHINE_VARIABLE) or described,
        "hardware": described,
        "cpus": cpus,
        "cpu_model": cpu_model,
        "memory_gib": memory_gib,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def _proc_field(path: str, name: str) -> str | None:
    """The value of the first `name: value` line of a /proc file (Linux), or None."""
    try:
        with open(path) as file:
            for line in file:
                key, _, value = line.partition(":")
                if key.strip() == name:
                    return value.strip()
    except OSError:
        pass
    return None


def write_results(
    script: str,
    parameters: argparse.Namespace | Mapping[str, object],
    tables: Sequence[Table],
    data: Mapping[str, object] | None = None,
    *,
    name: str | None = None,
) -> Path:
    """Writes benchmarks/results/<name>.json, `name` being the script's unless given (the shape
    in this module's docstring); returns its path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name or script}.json"
    document = {
        "script": script,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        "parameters": vars(parameters) if isinstance(parameters, argparse.Namespace) else dict(parameters),
        "tables": [asdict(table) for table in tables],
        "data": dict(data or {}),
    }
    path.write_text(json.dumps(document, indent=2, default=_plain))
    return path


def _plain(value: Any) -> object:
    """What json cannot write itself: dataclasses (Load, samples), numpy scalars, paths."""
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    if hasattr(value, "item"):  # a numpy scalar
        return value.item()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, set | frozenset):
        return sorted(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
