"""report.html opened in a real headless Chromium (Debian's `chromium`): the page's own scripts
draw every chart with no network, and the marks drawn are the measured points.

The report is written from a hand-made analysis (the writers are pure functions of it), so
every point's numbers are known. Chromium runs the page, then dumps the DOM its scripts built
(`--dump-dom`: no DevTools client needed); the test reads plotly's SVG there. Pixel positions
depend on the window and the fonts, so a chart's marks are checked against the measurements
through the axis's own linear map (two points fix it; every other point must sit on it), never
against fixed pixels. Nothing here is timed.
"""

from __future__ import annotations

import itertools
import re
import shutil
import struct
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import pytest

from coreserve.analyze._analysis import Analysis
from coreserve.analyze._points import Measurement, ModelSettings
from coreserve.analyze._ranking import Constraints
from coreserve.analyze.report._html import write_report
from coreserve.protos.model_config_pb2 import ModelConfig

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install chromium)"
)

WINDOW = (1280, 2400)  # wide enough for the charts' legends, tall enough for the whole report
CHROMIUM_TIMEOUT_S = 120  # a bound on the process, not a measurement
PIXEL_TOLERANCE = 0.05  # plotly writes coordinates to 1/100 of a pixel

CURRENT = ModelSettings(max_batch_size=8, dynamic_batching=False, instance_count=1)
BEST = ModelSettings(max_batch_size=8, dynamic_batching=True, instance_count=2, max_queue_delay_us=100)
THIRD = ModelSettings(max_batch_size=4, dynamic_batching=True, instance_count=1, max_queue_delay_us=500)
OVER_BUDGET = ModelSettings(max_batch_size=16, dynamic_batching=True, instance_count=4)
FAILED = ModelSettings(max_batch_size=2, dynamic_batching=False, instance_count=2)
BUDGET_MS = 20.0


def _point(settings: ModelSettings, concurrency: int, throughput: float, p99: float) -> Measurement:
    return Measurement(
        settings,
        concurrency,
        throughput=throughput,
        p99_ms=p99,
        p50_ms=p99 / 2,
        p95_ms=p99 * 0.9,
        avg_ms=p99 / 2 + 0.25,
        queue_ms=0.5,
        compute_input_ms=0.125,
        compute_infer_ms=p99 / 4,
        compute_output_ms=0.0625,
        server_cpu_percent=150.0,
        server_rss_mb=310.5,
        client_cpu_percent=20.0,
    )


MEASUREMENTS = [
    _point(BEST, 1, 120.5, 4.0),
    _point(BEST, 2, 230.0, 8.0),
    _point(BEST, 4, 400.25, 15.5),
    _point(CURRENT, 1, 100.0, 5.0),
    _point(CURRENT, 2, 180.0, 9.0),
    _point(CURRENT, 4, 200.0, 25.0),
    _point(THIRD, 1, 90.0, 6.0),
    _point(THIRD, 2, 170.0, 11.0),
    _point(OVER_BUDGET, 1, 900.0, 30.0),
    _point(OVER_BUDGET, 2, 1000.0, 45.0),
    Measurement(FAILED, 1, error="failed to load 'add_sub'"),
]
# The settings the chart draws, in the figure's order (settings order), and the best three in rank order.
DRAWN = sorted({point.settings for point in MEASUREMENTS if not point.failed})
RANKED = [BEST, CURRENT, THIRD]


def _measured(settings: ModelSettings) -> list[Measurement]:
    """The settings' points by concurrency: the order its line and its bars are drawn in."""
    return sorted((p for p in MEASUREMENTS if p.settings == settings), key=lambda p: p.concurrency)


@dataclass
class Element:
    """One element of the DOM Chromium dumped; enough of a tree to select by tag and class."""

    tag: str
    attrs: dict[str, str]
    children: list[Element] = field(default_factory=list)

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def all(self, tag: str, *classes: str) -> list[Element]:
        """The descendants with this tag and (at least) these classes, in document order."""
        found = []
        for child in self.children:
            if child.tag == tag and set(classes) <= child.classes:
                found.append(child)
            found += child.all(tag, *classes)
        return found

    def one(self, tag: str, *classes: str) -> Element:
        found = self.all(tag, *classes)
        assert len(found) == 1, f"{len(found)} <{tag} class='{' '.join(classes)}'> where one was expected"
        return found[0]

    def by_id(self, element_id: str) -> Element:
        found = [element for element in self.all("div") if element.attrs.get("id") == element_id]
        assert len(found) == 1, f"{len(found)} elements with id {element_id!r}"
        return found[0]


class _TreeBuilder(HTMLParser):
    # HTML elements that have no end tag; SVG elements are serialized with theirs.
    VOID = frozenset(["area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta"])
    VOID |= {"source", "track", "wbr"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#document", {})
        self.open = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {name: value or "" for name, value in attrs})
        self.open[-1].children.append(element)
        if tag not in self.VOID:
            self.open.append(element)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.open[-1].children.append(Element(tag, {name: value or "" for name, value in attrs}))

    def handle_endtag(self, tag: str) -> None:
        for depth in range(len(self.open) - 1, 0, -1):
            if self.open[depth].tag == tag:
                del self.open[depth:]
                return


def _chromium(profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Chromium, headless, with no network at all: the report must draw from its own file.
    (No sandbox: the tests may run as root, and the page is the one this test wrote.)"""
    assert CHROMIUM is not None
    command = [
        CHROMIUM,
        "--headless",
        "--disable-gpu",
        "--no-sandbox",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--host-resolver-rules=MAP * ~NOTFOUND",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        # Lets the page's scripts run (plotly draws after its promises settle) before the dump.
        "--virtual-time-budget=5000",
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=CHROMIUM_TIMEOUT_S, check=True)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = ModelConfig(name="add_sub", max_batch_size=8)
    base.instance_group.add(count=1)
    analysis = Analysis(
        model="add_sub",
        model_dir=None,
        base_config=base,
        constraints=Constraints(latency_budget_ms=BUDGET_MS),
        objective="throughput",
        measurements=list(MEASUREMENTS),
    )
    return write_report(analysis, tmp_path_factory.mktemp("report"))


@pytest.fixture(scope="module")
def dom(report: Path, tmp_path_factory: pytest.TempPathFactory) -> Element:
    dumped = _chromium(tmp_path_factory.mktemp("profile"), "--dump-dom", report.as_uri()).stdout
    builder = _TreeBuilder()
    builder.feed(dumped)
    builder.close()
    return builder.root


def _numbers(text: str, pattern: str) -> tuple[float, ...]:
    match = re.fullmatch(pattern, text)
    assert match, f"{text!r} does not read as {pattern}"
    return tuple(float(group) for group in match.groups())


NUMBER = r"(-?[\d.]+(?:e-?\d+)?)"
TRANSLATE = rf"translate\({NUMBER},\s*{NUMBER}\)"
BAR = rf"M{NUMBER},{NUMBER}V{NUMBER}H{NUMBER}V{NUMBER}Z"  # x0,y0 up to y1, across to x1, down


def _axis(pairs: list[tuple[float, float]]) -> tuple[Callable[[float], float], float]:
    """The linear map from data to pixels that the lowest and highest value fix, and its scale."""
    (low, low_px), (high, high_px) = min(pairs), max(pairs)
    scale = (high_px - low_px) / (high - low)
    return (lambda value: low_px + scale * (value - low)), scale


def test_the_page_draws_every_chart(dom: Element) -> None:
    for chart in ["throughput-latency", *[f"latency-split-{rank}" for rank in (1, 2, 3)]]:
        div = dom.by_id(chart)
        assert "js-plotly-plot" in div.classes, f"plotly did not draw {chart}"
        assert div.all("svg", "main-svg"), f"{chart} has no SVG"
    assert not [div for div in dom.all("div") if div.attrs.get("id") == "latency-split-4"]


def test_the_throughput_latency_chart_draws_each_measured_point(dom: Element) -> None:
    chart = dom.by_id("throughput-latency")
    traces = chart.one("g", "scatterlayer").all("g", "trace", "scatter")
    # One line per settings that served; the failed one has nothing to draw.
    assert len(traces) == len(DRAWN)
    drawn: list[tuple[Measurement, float, float]] = []
    for settings, trace in zip(DRAWN, traces, strict=True):
        marks = trace.all("path", "point")
        assert len(marks) == len(_measured(settings)), settings.describe()
        for point, mark in zip(_measured(settings), marks, strict=True):
            px, py = _numbers(mark.attrs["transform"], TRANSLATE)
            drawn.append((point, px, py))
    x, x_scale = _axis([(point.p99_ms, px) for point, px, _ in drawn])
    y, y_scale = _axis([(point.throughput, py) for point, _, py in drawn])
    assert x_scale > 0 and y_scale < 0  # latency to the right, throughput up
    for point, px, py in drawn:
        assert px == pytest.approx(x(point.p99_ms), abs=PIXEL_TOLERANCE), point
        assert py == pytest.approx(y(point.throughput), abs=PIXEL_TOLERANCE), point
    # The latency budget: a vertical line at 20 ms, drawn in the chart's coordinates (the points
    # are drawn in the plot area's, which the area's offset turns into the chart's).
    plot_x, _ = _numbers(chart.one("g", "overplot").one("g", "xy").attrs["transform"], TRANSLATE)
    lines = [path.attrs["d"] for group in chart.all("g", "shape-group") for path in group.all("path")]
    assert len(lines) == 1
    x0, top, x1, bottom = _numbers(lines[0], rf"M{NUMBER},{NUMBER}L{NUMBER},{NUMBER}")
    assert x0 == x1 == pytest.approx(plot_x + x(BUDGET_MS), abs=PIXEL_TOLERANCE) and top != bottom


def test_the_legend_names_the_best_three_by_rank(dom: Element) -> None:
    chart = dom.by_id("throughput-latency")
    names = {text.attrs["data-unformatted"] for text in chart.all("text", "legendtext")}
    ranked = {f"#{rank} {settings.describe()}" for rank, settings in enumerate(RANKED, start=1)}
    assert names == ranked | {OVER_BUDGET.describe()}


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_each_latency_split_stacks_the_servers_parts_per_concurrency(dom: Element, rank: int) -> None:
    measured = _measured(RANKED[rank - 1])
    server = [(p.queue_ms, p.compute_input_ms, p.compute_infer_ms, p.compute_output_ms) for p in measured]
    # The server's four parts, then what is left of the client's average latency.
    parts = [*zip(*server, strict=True), [p.avg_ms - sum(s) for p, s in zip(measured, server, strict=True)]]
    traces = dom.by_id(f"latency-split-{rank}").one("g", "barlayer").all("g", "trace", "bars")
    assert len(traces) == len(parts)
    bars = [
        [_numbers(point.one("path").attrs["d"], BAR) for point in trace.all("g", "point")] for trace in traces
    ]
    assert [len(trace) for trace in bars] == [len(measured)] * len(parts)
    # Each bar's height is its part's milliseconds on one linear scale from 0.
    heights = [
        (value, bar[1] - bar[2])
        for values, trace in zip(parts, bars, strict=True)
        for value, bar in zip(values, trace, strict=True)
    ]
    _, scale = _axis([(0.0, 0.0), *heights])
    for value, height in heights:
        assert height == pytest.approx(scale * value, abs=PIXEL_TOLERANCE)
    # Stacked: each part starts where the one below it ends, in the same column.
    for below, above in itertools.pairwise(bars):
        for lower, upper in zip(below, above, strict=True):
            assert upper[1] == pytest.approx(lower[2], abs=PIXEL_TOLERANCE)
            assert (upper[0], upper[3]) == (lower[0], lower[3])


def test_a_screenshot_of_the_report(report: Path, tmp_path: Path) -> None:
    screenshot = tmp_path / "report.png"
    _chromium(tmp_path / "profile", f"--screenshot={screenshot}", report.as_uri())
    image = screenshot.read_bytes()
    assert image[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", image[16:24])  # the IHDR chunk comes first
    assert (width, height) == WINDOW
    # A page of this size with one heading on it is about 15 KB; the charts and tables make it far more.
    assert len(image) > 50_000, len(image)
