"""The report's plotly charts: throughput against p99 latency for every settings measured, and
the server's split of the latency for one settings at each concurrency.

Every plotted point's numbers are in its figure (x, y, and the concurrency in `customdata`),
so whoever opens the report, a person hovering or a test reading the chart's `data`, finds
the measurements there. `go` is `plotly.graph_objects`, imported by the caller, since plotly
is an optional extra.
"""

from __future__ import annotations

import html
from typing import Any

from coreserve.analyze._analysis import Analysis
from coreserve.analyze._points import Measurement, ModelSettings

THROUGHPUT_LATENCY_ID = "throughput-latency"
# The parts of a request's time, as the server's statistics split it, then what is left of the
# client's average latency (the network, the client's own work).
SPLIT_PARTS = [
    ("queue", "queue_ms"),
    ("compute input", "compute_input_ms"),
    ("compute infer", "compute_infer_ms"),
    ("compute output", "compute_output_ms"),
]
POINT_HOVER = "concurrency %{customdata}<br>p99 %{x:.2f} ms<br>%{y:.1f} infer/s<extra>%{meta}</extra>"


def latency_split_id(rank: int) -> str:
    return f"latency-split-{rank}"


def figure_div(figure: Any, div_id: str) -> str:
    """The chart as a <div> and the script that draws it; plotly.js is in the page's head."""
    config = {"displaylogo": False, "responsive": True}
    return str(figure.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=config))


def throughput_latency_figure(go: Any, analysis: Analysis, highlighted: list[ModelSettings]) -> Any:
    """One line per settings (its points the concurrency levels, lowest first); the
    `highlighted` settings drawn thick and marked; the constraints drawn as lines."""
    figure = go.Figure()
    for settings, points in _by_settings(analysis.measurements).items():
        rank = highlighted.index(settings) + 1 if settings in highlighted else 0
        figure.add_trace(_settings_trace(go, settings, points, rank))
    figure.update_layout(
        title=f"Throughput against p99 latency: {html.escape(analysis.model)}",
        xaxis_title="p99 latency (ms)",
        yaxis_title="throughput (infer/s)",
        hovermode="closest",
        legend_title_text="configuration",
        height=560,
    )
    _draw_constraints(figure, analysis)
    return figure


def _by_settings(measurements: list[Measurement]) -> dict[ModelSettings, list[Measurement]]:
    """Each settings' measured (not failed) points by concurrency, settings in their order."""
    grouped: dict[ModelSettings, list[Measurement]] = {}
    for point in sorted(measurements, key=lambda point: (point.settings, point.concurrency)):
        if not point.failed:
            grouped.setdefault(point.settings, []).append(point)
    return grouped


def _settings_trace(go: Any, settings: ModelSettings, points: list[Measurement], rank: int) -> Any:
    name = f"#{rank} {settings.describe()}" if rank else settings.describe()
    style: dict[str, Any] = {
        "line": {"width": 1.5},
        "marker": {"size": 6},
        "opacity": 0.45,
        "legendrank": 1000,
    }
    if rank:
        style = {
            "line": {"width": 4},
            "marker": {"size": 11, "symbol": "diamond", "line": {"width": 1, "color": "black"}},
            "opacity": 1.0,
            "legendrank": rank,
        }
    return go.Scatter(
        x=[point.p99_ms for point in points],
        y=[point.throughput for point in points],
        customdata=[point.concurrency for point in points],
        mode="lines+markers",
        name=html.escape(name),
        meta=settings.key,
        hovertemplate=POINT_HOVER,
        **style,
    )


def _draw_constraints(figure: Any, analysis: Analysis) -> None:
    constraints = analysis.constraints
    if constraints.latency_budget_ms is not None:
        figure.add_vline(
            x=constraints.latency_budget_ms,
            line={"dash": "dash", "color": "crimson", "width": 2},
            annotation_text=f"latency budget {constraints.latency_budget_ms:g} ms",
            annotation_position="top right",
        )
    if constraints.min_throughput is not None:
        figure.add_hline(
            y=constraints.min_throughput,
            line={"dash": "dot", "color": "darkorange", "width": 2},
            annotation_text=f"minimum throughput {constraints.min_throughput:g} infer/s",
            annotation_position="bottom right",
        )


def latency_split_figure(go: Any, title: str, points: list[Measurement]) -> Any:
    """A stacked bar per concurrency: the server's queue and compute times, then the rest of
    the client's average latency."""
    ordered = sorted(points, key=lambda point: point.concurrency)
    concurrencies = [str(point.concurrency) for point in ordered]
    parts = [(label, [getattr(point, field) for point in ordered]) for label, field in SPLIT_PARTS]
    parts.append(("client and network", [max(0.0, point.avg_ms - _server_ms(point)) for point in ordered]))
    figure = go.Figure()
    for label, values in parts:
        figure.add_trace(go.Bar(x=concurrencies, y=values, name=label, hovertemplate=_bar_hover(label)))
    figure.update_layout(
        barmode="stack",
        title=html.escape(title),
        xaxis={"title": "concurrency", "type": "category"},
        yaxis_title="average latency (ms)",
        height=380,
    )
    return figure


def _server_ms(point: Measurement) -> float:
    return point.queue_ms + point.compute_input_ms + point.compute_infer_ms + point.compute_output_ms


def _bar_hover(label: str) -> str:
    return f"concurrency %{{x}}<br>{label} %{{y:.3f}} ms<extra></extra>"
