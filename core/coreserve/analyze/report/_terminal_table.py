"""The table `coreserve analyze` prints when it ends: the best configurations and their change
from the model's current one, or, where nothing meets the constraints, the closest and what
each breaks."""

from __future__ import annotations

from coreserve.analyze._analysis import Analysis
from coreserve.analyze._points import Measurement
from coreserve.analyze.report._wording import (
    Recommendation,
    client_bound_note,
    describe_constraints,
    dynamic_batching_label,
    instance_counts_text,
    recommendations,
    usage_cells,
    usage_headers,
    violations_text,
)

BEST_HEADERS = [
    "#",
    "max batch",
    "dynamic batching",
    "instances",
    "concurrency",
    "infer/s",
    "p50 ms",
    "p95 ms",
    "p99 ms",
]
CHANGE_HEADERS = ["Δ infer/s", "Δ p99"]
CLOSEST_HEADERS = ["max batch", "dynamic batching", "instances", "concurrency", "infer/s", "p99 ms", "breaks"]


def best_table(analysis: Analysis, top: int = 3) -> str:
    """The text to print: a heading, the table (or the nearest misses) and any notes."""
    rows = recommendations(analysis, top)
    if not rows:
        return _nothing_passes(analysis, top)
    lines = [
        f"Best configurations of '{analysis.model}' "
        f"(constraints: {describe_constraints(analysis.constraints)}; objective: {analysis.objective})",
        "",
        _table(
            [*BEST_HEADERS, *usage_headers(analysis), *CHANGE_HEADERS],
            [_best_cells(analysis, row) for row in rows],
        ),
    ]
    lines += _baseline_notes(analysis, rows)
    lines += _client_notes(rows[0].point)
    return "\n".join(lines)


def _best_cells(analysis: Analysis, row: Recommendation) -> list[str]:
    point = row.point
    return [
        str(row.rank),
        *_settings_cells(point),
        str(point.concurrency),
        f"{point.throughput:.1f}",
        f"{point.p50_ms:.2f}",
        f"{point.p95_ms:.2f}",
        f"{point.p99_ms:.2f}",
        *usage_cells(analysis, point),
        row.throughput_change,
        row.p99_change,
    ]


def _settings_cells(point: Measurement) -> list[str]:
    settings = point.settings
    if not settings.own_settings:  # an ensemble: only its steps' instances were changed
        return ["-", "-", instance_counts_text(settings)]
    return [str(settings.max_batch_size), dynamic_batching_label(settings), instance_counts_text(settings)]


def _baseline_notes(analysis: Analysis, rows: list[Recommendation]) -> list[str]:
    current = analysis.baseline.describe()
    if analysis.baseline_best() is None:
        return ["", f"Δ n/a: the current configuration ({current}) met the constraints at no load measured."]
    if any(row.is_baseline for row in rows):
        return ["", f"'baseline' marks the current configuration ({current})."]
    return ["", f"Δ: change from the current configuration ({current}) at its best passing load."]


def _client_notes(point: Measurement) -> list[str]:
    note = client_bound_note(point)
    return ["", note] if note else []


def _nothing_passes(analysis: Analysis, top: int) -> str:
    constraints = describe_constraints(analysis.constraints)
    closest = analysis.ranking().closest[:top]
    lines = [f"No configuration of '{analysis.model}' meets the constraints ({constraints})."]
    if not closest:
        lines.append("Every configuration failed: results/metrics-model-inference.csv has their errors.")
        return "\n".join(lines)
    lines += ["The closest configurations, and what they break:", ""]
    cells = [
        [
            *_settings_cells(point),
            str(point.concurrency),
            f"{point.throughput:.1f}",
            f"{point.p99_ms:.2f}",
            violations_text(analysis, point),
        ]
        for point in closest
    ]
    lines.append(_table(CLOSEST_HEADERS, cells))
    lines += _client_notes(closest[0])
    return "\n".join(lines)


def _table(headers: list[str], rows: list[list[str]]) -> str:
    """Columns as wide as their widest cell; the last column (words) left-aligned, numbers right."""
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        padded = [cell.rjust(width) for cell, width in zip(cells[:-1], widths, strict=False)]
        return "  ".join([*padded, cells[-1].ljust(widths[-1])]).rstrip()

    rule = "  ".join("-" * width for width in widths)
    return "\n".join([line(headers), rule, *(line(row) for row in rows)])
