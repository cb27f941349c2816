"""The table of models, versions and states printed at start-up."""

from __future__ import annotations

from coreserve.repository import Model
from coreserve.repository.namespaces import qualified


def model_status_table(models: list[Model]) -> str:
    rows = [("Model", "Version", "Status")]
    for model in models:
        name = qualified(model.namespace, model.name)  # <repository>::<name> under namespacing, as Triton
        if not model.versions:
            rows.append((name, "-", f"UNAVAILABLE: {model.reason}"))
        for version in sorted(model.versions.values(), key=lambda v: v.version):
            status = version.state.value + (f": {version.reason}" if version.reason else "")
            rows.append((name, str(version.version), status))
    if len(rows) == 1:
        rows.append(("(no models)", "", ""))
    # A cell of several lines (a load error with its frames) takes as many lines of the table, in
    # its own column, as Triton's table printer does.
    cells = [[cell.splitlines() or [""] for cell in row] for row in rows]
    widths = [max(len(line) for row in cells for line in row[i]) for i in range(3)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    lines = [rule]
    for index, row in enumerate(cells):
        for depth in range(max(len(cell) for cell in row)):
            parts = (cell[depth] if depth < len(cell) else "" for cell in row)
            padded = (part.ljust(width) for part, width in zip(parts, widths, strict=True))
            lines.append("| " + " | ".join(padded) + " |")
        if index == 0:
            lines.append(rule)
    lines.append(rule)
    return "\n".join(lines)
