"""The CSV files of an analysis, with Model Analyzer's column names where they mean the same.

`results/metrics-model-inference.csv` has one row per measurement (Model Analyzer's file of
that name, plus the server's latency split, the client's CPU, the requests that failed,
whether the windows were stable, and an "Error" column where a configuration failed);
`results/metrics-model-summary.csv` has one row per ranked settings.
"""

from __future__ import annotations

import csv
from pathlib import Path

from coreserve.analyze._analysis import Analysis
from coreserve.analyze._points import CLIENT_BATCH_SIZE, Measurement
from coreserve.analyze.report._wording import config_path_name, instances_text, violations_text

# Model Analyzer's own columns first, in its order; then ours, named as it names its columns.
INFERENCE_COLUMNS = [
    "Model",
    "Batch",
    "Concurrency",
    "Model Config Path",
    "Instance Group",
    "Max Batch Size",
    "Satisfies Constraints",
    "Throughput (infer/sec)",
    "p99 Latency (ms)",
    "p95 Latency (ms)",
    "p50 Latency (ms)",
    "Avg Latency (ms)",
    "Server Queue (ms)",
    "Server Compute Input (ms)",
    "Server Compute Infer (ms)",
    "Server Compute Output (ms)",
    "CPU Utilization (%)",
    "RAM Usage (MB)",
    "Average GPU Utilization (%)",
    "Max GPU Memory Usage (MB)",
    "Client CPU (%)",
    "Dynamic Batching",
    "Max Queue Delay (us)",
    "Failed Requests",
    "Stable",
    "Error",
]
SUMMARY_COLUMNS = [
    "Rank",
    "Model",
    "Model Config Path",
    "Instance Group",
    "Max Batch Size",
    "Dynamic Batching",
    "Max Queue Delay (us)",
    "Satisfies Constraints",
    "Concurrency",
    "Throughput (infer/sec)",
    "p99 Latency (ms)",
    "p95 Latency (ms)",
    "p50 Latency (ms)",
    "CPU Utilization (%)",
    "RAM Usage (MB)",
    "Average GPU Utilization (%)",
    "Max GPU Memory Usage (MB)",
    "Constraint Violations",
]


def write_csv_files(analysis: Analysis, out_dir: Path) -> list[Path]:
    """Writes both files under `out_dir/results/`; returns their paths."""
    results = out_dir / "results"
    results.mkdir(parents=True, exist_ok=True)
    inference = results / "metrics-model-inference.csv"
    points = sorted(analysis.measurements, key=lambda point: (point.settings, point.concurrency))
    _write(inference, INFERENCE_COLUMNS, [_inference_row(analysis, point) for point in points])
    summary = results / "metrics-model-summary.csv"
    ranking = analysis.ranking()
    ranked = [*ranking.passing, *ranking.closest]
    rows = [_summary_row(analysis, rank, point) for rank, point in enumerate(ranked, start=1)]
    _write(summary, SUMMARY_COLUMNS, rows)
    return [inference, summary]


def _write(path: Path, columns: list[str], rows: list[dict[str, object]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as file:
        writer = csv.DictWriter(file, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def _settings_columns(analysis: Analysis, point: Measurement) -> dict[str, object]:
    settings = point.settings
    return {
        "Model": analysis.model,
        "Model Config Path": config_path_name(analysis.model, settings),
        "Instance Group": instances_text(analysis, settings),
        "Max Batch Size": settings.max_batch_size,
        "Dynamic Batching": "Enabled" if settings.dynamic_batching else "Disabled",
        "Max Queue Delay (us)": settings.max_queue_delay_us if settings.dynamic_batching else "",
        "Satisfies Constraints": "Yes" if analysis.constraints.met_by(point) else "No",
    }


def _inference_row(analysis: Analysis, point: Measurement) -> dict[str, object]:
    row = _settings_columns(analysis, point)
    row.update({"Batch": CLIENT_BATCH_SIZE, "Concurrency": point.concurrency})
    if point.failed:
        row["Error"] = point.error
        return row
    row.update(_number_columns(point))
    row.update(
        {
            "Avg Latency (ms)": _number(point.avg_ms),
            "Server Queue (ms)": _number(point.queue_ms),
            "Server Compute Input (ms)": _number(point.compute_input_ms),
            "Server Compute Infer (ms)": _number(point.compute_infer_ms),
            "Server Compute Output (ms)": _number(point.compute_output_ms),
            "Client CPU (%)": _number(point.client_cpu_percent),
            "Failed Requests": point.errors,
            "Stable": "No" if point.extra.get("stable") is False else "Yes",
            "Error": "",
        }
    )
    return row


def _summary_row(analysis: Analysis, rank: int, point: Measurement) -> dict[str, object]:
    row = _settings_columns(analysis, point)
    row.update(_number_columns(point))
    row.update({"Rank": rank, "Concurrency": point.concurrency})
    row["Constraint Violations"] = violations_text(analysis, point)
    return row


def _number_columns(point: Measurement) -> dict[str, object]:
    return {
        "Throughput (infer/sec)": _number(point.throughput),
        "p99 Latency (ms)": _number(point.p99_ms),
        "p95 Latency (ms)": _number(point.p95_ms),
        "p50 Latency (ms)": _number(point.p50_ms),
        "CPU Utilization (%)": _number_or_blank(point.server_cpu_percent),
        "RAM Usage (MB)": _number_or_blank(point.server_rss_mb),
        "Average GPU Utilization (%)": _number_or_blank(point.gpu_utilization_percent),
        "Max GPU Memory Usage (MB)": _number_or_blank(point.gpu_memory_mb),
    }


def _number(value: float) -> float:
    """Three decimals: microseconds in milliseconds, a thousandth of an inference per second."""
    return round(value, 3)


def _number_or_blank(value: float | None) -> float | str:
    return "" if value is None else _number(value)
