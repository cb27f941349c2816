"""`report.html`: the analysis as one self-contained page that opens offline in a browser.

The page holds plotly.js itself (no network to view it), the constraints, the best
configurations, the throughput-against-latency chart of every settings, each best one's
latency split, and the settings that failed. Every string that comes from the model (its
name, errors its backend raised) is escaped.
"""

from __future__ import annotations

import html
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any

from coreserve.analyze._analysis import Analysis
from coreserve.analyze._points import Measurement
from coreserve.analyze.report._charts import (
    THROUGHPUT_LATENCY_ID,
    figure_div,
    latency_split_figure,
    latency_split_id,
    throughput_latency_figure,
)
from coreserve.analyze.report._output_repository import OUTPUT_REPOSITORY, output_model_name
from coreserve.analyze.report._wording import (
    Recommendation,
    client_bound_note,
    describe_constraints,
    recommendations,
    usage_cells,
    usage_headers,
    violations_text,
)
from coreserve.errors import UnsupportedError

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 78rem; color: #222; }
table { border-collapse: collapse; margin: 0.5rem 0 1.5rem; }
th, td { border: 1px solid #ccc; padding: 0.3rem 0.6rem; text-align: right; }
th { background: #f2f2f2; }
td.text, th.text { text-align: left; }
.note { background: #fff6dd; border-left: 4px solid #e0a800; padding: 0.5rem 0.8rem; }
.meta { color: #666; }
"""


def write_report(analysis: Analysis, out_dir: Path, top: int = 3) -> Path:
    """Writes `out_dir/report.html`; returns its path. Needs plotly (core-server[analyze])."""
    plotly, go = _import_plotly()
    rows = recommendations(analysis, top)
    body = [
        _heading(analysis),
        "<h2>Constraints</h2>",
        f"<p>{html.escape(describe_constraints(analysis.constraints))}</p>",
        *_best_section(analysis, rows, top, _written_folders(out_dir)),
        "<h2>Throughput against p99 latency</h2>",
        figure_div(
            throughput_latency_figure(go, analysis, [row.point.settings for row in rows]),
            THROUGHPUT_LATENCY_ID,
        ),
        *_split_section(go, analysis, rows, top),
        *_failed_section(analysis),
    ]
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "report.html"
    path.write_text(_page(analysis.model, plotly.offline.get_plotlyjs(), body), encoding="utf-8")
    return path


def _import_plotly() -> tuple[ModuleType, ModuleType]:
    try:
        import plotly
        import plotly.graph_objects as go
        import plotly.offline  # get_plotlyjs(): the library, written into the page
    except ImportError as exc:
        raise UnsupportedError(
            f"the analysis report needs plotly: pip install 'core-server[analyze]' ({exc})"
        ) from exc
    return plotly, go


def _page(model: str, plotly_js: str, body: list[str]) -> str:
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>coreserve analyze: {html.escape(model)}</title>",
            f"<style>{STYLE}</style>",
            f'<script type="text/javascript">{plotly_js}</script>',
            "</head><body>",
            *body,
            "</body></html>",
        ]
    )


def _heading(analysis: Analysis) -> str:
    settings = {point.settings for point in analysis.measurements}
    failed = {point.settings for point in analysis.measurements if point.failed}
    return (
        f"<h1>coreserve analyze: {html.escape(analysis.model)}</h1>\n"
        f'<p class="meta">{datetime.now().strftime("%Y-%m-%d %H:%M")} · objective: '
        f"{html.escape(analysis.objective)} · {len(analysis.measurements)} points on {len(settings)} "
        f"configurations ({len(failed)} failed) · current configuration: "
        f"{html.escape(analysis.baseline.describe())}</p>"
    )


def _folder(name: str, written: set[str]) -> str:
    return name if name in written else "-"


def _written_folders(out_dir: Path) -> set[str]:
    """The output repository's folders: a composed model writes its best set only, and a
    running server measured without its repository none."""
    repository = out_dir / OUTPUT_REPOSITORY
    return {path.name for path in repository.iterdir()} if repository.is_dir() else set()


def _best_section(analysis: Analysis, rows: list[Recommendation], top: int, written: set[str]) -> list[str]:
    if not rows:
        return _closest_section(analysis, top)
    headers = ["#", "output folder", "configuration", *NUMBER_HEADERS, *usage_headers(analysis)]
    headers += ["Δ infer/s", "Δ p99"]
    cells = [
        [
            str(row.rank),
            _folder(output_model_name(analysis.model, row.rank - 1), written),
            row.point.settings.describe(),
            *_numbers(analysis, row.point),
            row.throughput_change,
            row.p99_change,
        ]
        for row in rows
    ]
    section = ["<h2>Best configurations</h2>", _table(headers, cells, text_columns={1, 2})]
    if analysis.baseline_best() is None:
        section.append(
            '<p class="note">Δ n/a: the current configuration met the constraints at no load measured.</p>'
        )
    return section + _client_note(rows[0].point)


def _closest_section(analysis: Analysis, top: int) -> list[str]:
    message = f"No configuration meets the constraints ({describe_constraints(analysis.constraints)})."
    section = ["<h2>Best configurations</h2>", f'<p class="note">{html.escape(message)}</p>']
    closest = analysis.ranking().closest[:top]
    if not closest:
        return [*section, "<p>Every configuration failed: see the errors below.</p>"]
    headers = ["configuration", *NUMBER_HEADERS, *usage_headers(analysis), "breaks"]
    cells = [
        [point.settings.describe(), *_numbers(analysis, point), violations_text(analysis, point)]
        for point in closest
    ]
    section += [
        "<h3>The closest configurations</h3>",
        _table(headers, cells, text_columns={0, len(headers) - 1}),
    ]
    return section + _client_note(closest[0])


NUMBER_HEADERS = ["concurrency", "infer/s", "p50 ms", "p95 ms", "p99 ms"]


def _numbers(analysis: Analysis, point: Measurement) -> list[str]:
    return [
        str(point.concurrency),
        f"{point.throughput:.1f}",
        f"{point.p50_ms:.2f}",
        f"{point.p95_ms:.2f}",
        f"{point.p99_ms:.2f}",
        *usage_cells(analysis, point),
    ]


def _client_note(point: Measurement) -> list[str]:
    note = client_bound_note(point)
    return [f'<p class="note">{html.escape(note)}</p>'] if note else []


def _split_section(go: Any, analysis: Analysis, rows: list[Recommendation], top: int) -> list[str]:
    """Each best settings' latency split; where nothing passes, the closest ones'."""
    chosen = [row.point.settings for row in rows] or [
        point.settings for point in analysis.ranking().closest[:top]
    ]
    section = ["<h2>Latency split</h2>"] if chosen else []
    for rank, settings in enumerate(chosen, start=1):
        points = [p for p in analysis.measurements if p.settings == settings and not p.failed]
        label = "#" if rows else "closest #"
        title = f"{label}{rank}: {settings.describe()}"
        section.append(figure_div(latency_split_figure(go, title, points), latency_split_id(rank)))
    return section


def _failed_section(analysis: Analysis) -> list[str]:
    failed = sorted(
        (point for point in analysis.measurements if point.failed),
        key=lambda point: (point.settings, point.concurrency),
    )
    if not failed:
        return ["<h2>Failed configurations</h2>", "<p>None: every configuration loaded and served.</p>"]
    cells = [[point.settings.describe(), str(point.concurrency), point.error] for point in failed]
    table = _table(["configuration", "concurrency", "error"], cells, text_columns={0, 2})
    return ["<h2>Failed configurations</h2>", f'<div id="failed-configurations">{table}</div>']


def _table(headers: list[str], rows: list[list[str]], text_columns: set[int]) -> str:
    """An HTML table; every cell escaped; `text_columns` left-aligned."""

    def cell(tag: str, index: int, value: str) -> str:
        kind = ' class="text"' if index in text_columns else ""
        return f"<{tag}{kind}>{html.escape(value)}</{tag}>"

    head = "".join(cell("th", index, value) for index, value in enumerate(headers))
    body = ["<tr>" + "".join(cell("td", i, value) for i, value in enumerate(row)) + "</tr>" for row in rows]
    return "\n".join(["<table>", f"<thead><tr>{head}</tr></thead>", "<tbody>", *body, "</tbody></table>"])
