"""Renders benchmark results (benchmarks/results/*.json) as markdown tables.

    python -m benchmarks.tables                      # every results file, to stdout
    python -m benchmarks.tables batching grpc_speed  # some, by script name or path
    python -m benchmarks.tables --output FILE        # written to FILE instead
    python -m benchmarks.tables --heading-level 3    # each result under a "###" heading

For each results file: a heading naming the script, a line with its date, machine and
parameters, then each of its tables with its title. Values are formatted as the scripts print
them. The files' shape is described in reporting.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.support.reporting import RESULTS, format_value


def result_files(names: Sequence[str], folder: Path = RESULTS) -> list[Path]:
    """The results files named (a script's name or a path), or every one in `folder`."""
    if not names:
        return sorted(folder.glob("*.json"))
    files = []
    for name in names:
        path = Path(name)
        files.append(path if path.suffix == ".json" else folder / f"{name}.json")
    return files


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown table: the first column left-aligned, the others right-aligned (numbers)."""

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    rule = ["---"] + ["---:"] * (len(columns) - 1)
    lines = [line([str(c) for c in columns]), "| " + " | ".join(rule) + " |"]
    lines += [line([format_value(value) for value in row]) for row in rows]
    return "\n".join(lines)


def render(document: Mapping[str, Any], heading_level: int = 2, name: str = "") -> str:
    """One results document as markdown: heading, provenance line, tables. `name`: the file's,
    where it is not the script's (a second run kept beside the last, as workers-h200.json)."""
    machine = document.get("machine") or {}
    parameters = document.get("parameters") or {}
    described = ", ".join(
        f"`{key}={_parameter(value)}`" for key, value in parameters.items() if value is not None
    )
    parts = [
        f"{'#' * heading_level} {document['script']}"
        + (f" ({name})" if name and name != document["script"] else ""),
        f"Run {document['date']} on {machine.get('description', 'an unnamed machine')}"
        + (f"; parameters: {described}" if described else "")
        + ".",
    ]
    gpu = machine.get("gpu")
    if gpu:  # benchmarks.gpu's results: the card and the software beside the figures
        software = machine.get("software") or {}
        parts[1] += (
            f" GPU: {gpu}, driver {machine.get('gpu_driver')}; torch {software.get('torch')}"
            f" (CUDA {software.get('torch_cuda')}); coreserve {software.get('coreserve_commit')}."
        )
    failed = (document.get("data") or {}).get("errors") or {}
    if failed:
        parts.append(
            "Stages that failed: " + "; ".join(f"{name}: {error[:200]}" for name, error in failed.items())
        )
    for table in document.get("tables", []):
        parts.append(f"**{table['title']}**")
        parts.append(markdown_table(table["columns"], table["rows"]))
    return "\n\n".join(parts) + "\n"


def _parameter(value: object) -> str:
    """A parameter as typed on the command line: lists joined with commas."""
    if isinstance(value, list | tuple):
        return ",".join(str(item) for item in value)
    return str(value)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("results", nargs="*", help="script names or results files (default: all)")
    parser.add_argument("--output", type=Path, help="write the markdown here instead of stdout")
    parser.add_argument("--heading-level", type=int, default=2, choices=range(1, 7))
    args = parser.parse_args(argv)
    rendered, failed = [], 0
    for path in result_files(args.results):
        try:
            document = json.loads(path.read_text())
            rendered.append(render(document, args.heading_level, path.stem))
        except (OSError, ValueError, KeyError) as exc:
            print(f"{path}: not a results file ({type(exc).__name__}: {exc})", file=sys.stderr)
            failed += 1
    markdown = "\n".join(rendered)
    if args.output is not None:
        args.output.write_text(markdown)
    else:
        sys.stdout.write(markdown)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
