"""`coreserve analyze`'s checkpoint and the rules its figures pass through: what a resumed
analysis reads back, what it refuses, the stability rule, perf_analyzer's CSV and the GPUs'
figures read from the server's metrics."""

from __future__ import annotations

from pathlib import Path

import pytest

from coreserve.analyze._points import Measurement, ModelSettings
from coreserve.analyze.measure._gpu_metrics import (
    MEMORY_USED,
    UTILIZATION,
    GpuFigures,
    GpuSample,
    gpu_figures,
    gpu_sample,
)
from coreserve.analyze.measure._load import _stable, _Window
from coreserve.analyze.measure._perf_analyzer import _fill
from coreserve.analyze.search._checkpoint import FILE_NAME, Checkpoint, CheckpointMismatch
from coreserve.server.metrics._system_metrics import family

WHAT = {"model": "m", "server": "started on /models", "load": "grpc by coreserve analyze"}
SETTINGS = ModelSettings(4, True, 2, 100, composing=(("pre", 1),))


def test_points_come_back_as_they_were_written(tmp_path: Path) -> None:
    first = Checkpoint(tmp_path, WHAT)
    point = Measurement(SETTINGS, 2, throughput=10.5, p99_ms=3.0, server_rss_mb=None, extra={"stable": False})
    first.add(point)
    again = Checkpoint(tmp_path, WHAT)
    assert again.get(SETTINGS, 2) == point and again.get(SETTINGS, 4) is None
    assert again.measurements() == [point]


def test_a_line_cut_short_by_an_interruption_is_skipped(tmp_path: Path) -> None:
    Checkpoint(tmp_path, WHAT).add(Measurement(SETTINGS, 1, throughput=1.0))
    with (tmp_path / FILE_NAME).open("a") as file:
        file.write('{"settings": {"max_batch')
    assert [point.concurrency for point in Checkpoint(tmp_path, WHAT).measurements()] == [1]


@pytest.mark.parametrize(
    ("key", "other"),
    [("model", "n"), ("server", "127.0.0.1:8001"), ("load", "http by perf_analyzer")],
)
def test_measurements_of_another_model_server_or_load_are_refused(
    tmp_path: Path, key: str, other: str
) -> None:
    Checkpoint(tmp_path, WHAT).add(Measurement(SETTINGS, 1, throughput=1.0))
    with pytest.raises(CheckpointMismatch, match=f"measurements of {key} .*not '{other}'"):
        Checkpoint(tmp_path, {**WHAT, key: other})


def test_a_checkpoint_without_points_is_taken_over(tmp_path: Path) -> None:
    Checkpoint(tmp_path, WHAT)  # a run that stopped before its first point (a mistyped model)
    taken = Checkpoint(tmp_path, {**WHAT, "model": "n"})
    assert taken.measurements() == []
    assert '"model": "n"' in (tmp_path / FILE_NAME).read_text()


def window(throughput: float, p99_s: float) -> _Window:
    latencies = [p99_s] * 100
    return _Window(completed=int(throughput), errors=0, latencies_s=latencies, began=0.0, ended=1.0)


def test_three_windows_are_stable_within_ten_percent_of_their_mean_on_both_figures() -> None:
    assert _stable([window(100, 0.010), window(105, 0.0105), window(95, 0.0095)])
    assert not _stable([window(100, 0.010), window(130, 0.010), window(95, 0.010)])  # throughput
    assert not _stable([window(100, 0.010), window(100, 0.013), window(100, 0.010)])  # p99
    assert not _stable([window(0, 0.0)] * 3)  # nothing answered: nothing to call stable


def test_perf_analyzers_csv_row_in_milliseconds_with_the_average_as_the_sum_of_its_parts() -> None:
    row = {
        "Concurrency": "2", "Inferences/Second": "3163.86", "Client Send": "2", "Network+Server Send/Recv": "511",
        "Server Queue": "64", "Server Compute Input": "4", "Server Compute Infer": "36", "Server Compute Output": "8",
        "Client Recv": "1", "p50 latency": "572", "p90 latency": "870", "p95 latency": "1045", "p99 latency": "1746",
    }  # fmt: skip
    point = Measurement(SETTINGS, 2)
    _fill(point, row)
    assert point.throughput == 3163.86
    assert (point.p50_ms, point.p95_ms, point.p99_ms) == (0.572, 1.045, 1.746)
    assert (point.queue_ms, point.compute_input_ms, point.compute_infer_ms, point.compute_output_ms) == (
        0.064, 0.004, 0.036, 0.008,
    )  # fmt: skip
    assert point.avg_ms == pytest.approx(0.626)


def test_gpu_figures_are_read_from_the_servers_metrics_text() -> None:
    # The exposition as the server writes it (its own formatter), beside families of other kinds.
    def text(utilization: tuple[float, float], used_mb: tuple[int, int]) -> str:
        gpus = [f'{{gpu_uuid="GPU-{name}"}}' for name in "ab"]
        rates = [f"{UTILIZATION}{gpu} {rate}" for gpu, rate in zip(gpus, utilization, strict=True)]
        used = [f"{MEMORY_USED}{gpu} {mb * 10**6}" for gpu, mb in zip(gpus, used_mb, strict=True)]
        lines = family("nv_cpu_utilization", "gauge", "CPU", ["nv_cpu_utilization 0.5"])
        lines += family(UTILIZATION, "gauge", "GPU", rates) + family(MEMORY_USED, "gauge", "memory", used)
        return "\n".join(lines) + "\n"

    first = gpu_sample(text((0.25, 0.75), (100, 300)), at=10.0)
    assert first == GpuSample(10.0, {"GPU-a": 0.25, "GPU-b": 0.75}, {"GPU-a": 100e6, "GPU-b": 300e6})
    second = gpu_sample(text((1.0, 0.0), (150, 300)), at=11.0)
    assert second is not None
    # utilisation averaged over the GPUs and the readings; memory: the most both held at once
    assert gpu_figures([first, second], since=9.5, until=11.5) == GpuFigures(50.0, 450.0)
    assert gpu_figures([first, second], since=10.5, until=11.5) == GpuFigures(50.0, 450.0)
    # a window shorter than the reading interval takes the last reading before its end
    assert gpu_figures([first, second], since=10.2, until=10.4) == GpuFigures(50.0, 400.0)
    assert gpu_figures([first], since=0.0, until=5.0) is None
    assert gpu_sample("nv_cpu_utilization 0.5\n# HELP nv_gpu_utilization x\n", at=0.0) is None
