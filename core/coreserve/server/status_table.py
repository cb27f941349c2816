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
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    lines = [rule]
    for index, row in enumerate(rows):
        lines.append("| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) + " |")
        if index == 0:
            lines.append(rule)
    lines.append(rule)
    return "\n".join(lines)
