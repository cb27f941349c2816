"""The outputs of `coreserve analyze`: the CSV files, the terminal table, the output model
repository (loaded by a real coreserve) and report.html, written from a hand-made analysis.

The writers are pure functions of an `Analysis`, so the measurements here are plain data; the
model folder is a real ONNX model (tests/support/model_builders.py) that the output repository copies.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from coreserve.analyze._analysis import Analysis
from coreserve.analyze._points import GPU, Measurement, ModelSettings
from coreserve.analyze._ranking import Constraints
from coreserve.analyze.report._csv_files import INFERENCE_COLUMNS, write_csv_files
from coreserve.analyze.report._html import write_report
from coreserve.analyze.report._output_repository import write_output_repository
from coreserve.analyze.report._terminal_table import best_table
from coreserve.analyze.report._wording import instance_group_label
from coreserve.config import parse_config, read_config_file
from coreserve.protos.model_config_pb2 import ModelInstanceGroup
from coreserve.testing import ServerFactory, ServerProcess
from support.model_builders import ADD_SUB_CONFIG, add_sub_model, write_model

CURRENT = ModelSettings(max_batch_size=8, dynamic_batching=False, instance_count=1)  # ADD_SUB_CONFIG's
BEST = ModelSettings(max_batch_size=8, dynamic_batching=True, instance_count=2, max_queue_delay_us=100)
THIRD = ModelSettings(max_batch_size=4, dynamic_batching=True, instance_count=1, max_queue_delay_us=500)
# The highest throughput of all, at every level over the 20 ms budget: never recommended.
OVER_BUDGET = ModelSettings(max_batch_size=16, dynamic_batching=True, instance_count=4)
FAILED = ModelSettings(max_batch_size=2, dynamic_batching=False, instance_count=2)
FAILURE = "failed to load 'add_sub': <bad & wrong>"
MODEL_FILE = add_sub_model().SerializeToString()


def _point(
    settings: ModelSettings, concurrency: int, throughput: float, p99: float, **more: float
) -> Measurement:
    values: dict[str, float] = {
        "p50_ms": p99 / 2,
        "p95_ms": p99 * 0.9,
        "avg_ms": p99 / 2 + 0.25,
        "queue_ms": 0.5,
        "compute_input_ms": 0.125,
        "compute_infer_ms": p99 / 4,
        "compute_output_ms": 0.0625,
        "server_cpu_percent": 150.0,
        "server_rss_mb": 310.5,
        "client_cpu_percent": 20.0,
    }
    values.update(more)
    return Measurement(settings, concurrency, throughput=throughput, p99_ms=p99, **values)


MEASUREMENTS = [
    # Given out of order: the CSV sorts by settings, then concurrency.
    _point(BEST, 4, 400.25, 15.5),
    _point(BEST, 1, 120.5, 4.0),
    _point(BEST, 2, 230.0, 8.0),
    _point(CURRENT, 1, 100.0, 5.0),
    _point(CURRENT, 2, 180.0, 9.0),
    _point(CURRENT, 4, 200.0, 25.0),
    _point(THIRD, 1, 90.0, 6.0),
    _point(THIRD, 2, 170.0, 11.0),
    _point(OVER_BUDGET, 1, 900.0, 30.0),
    _point(OVER_BUDGET, 2, 1000.0, 45.0),
    Measurement(FAILED, 1, error=FAILURE),
]


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A real ONNX model folder, with a file beside its version folder and a cache to leave out."""
    folder = write_model(tmp_path / "repository", "add_sub", MODEL_FILE, ADD_SUB_CONFIG)
    (folder / "labels.txt").write_text("sum\ndifference\n")
    (folder / "__pycache__").mkdir()
    (folder / "__pycache__" / "stale.pyc").write_bytes(b"\0")
    return folder


@pytest.fixture
def analysis(model_dir: Path) -> Analysis:
    return Analysis(
        model="add_sub",
        model_dir=model_dir,
        base_config=read_config_file(model_dir / "config.pbtxt"),
        constraints=Constraints(latency_budget_ms=20),
        objective="throughput",
        measurements=list(MEASUREMENTS),
    )


def _with_budget(analysis: Analysis, budget: float) -> Analysis:
    return dataclasses.replace(analysis, constraints=Constraints(latency_budget_ms=budget))


def _read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="", encoding="utf-8") as file:
        reader = csv.DictReader(file)
        return list(reader.fieldnames or []), list(reader)


# The CSV files


def test_inference_csv_has_model_analyzers_columns_then_ours(analysis: Analysis, tmp_path: Path) -> None:
    inference, summary = write_csv_files(analysis, tmp_path / "out")
    assert inference == tmp_path / "out" / "results" / "metrics-model-inference.csv"
    assert summary == tmp_path / "out" / "results" / "metrics-model-summary.csv"
    headers, _ = _read_csv(inference)
    assert headers[:9] == [
        "Model",
        "Batch",
        "Concurrency",
        "Model Config Path",
        "Instance Group",
        "Max Batch Size",
        "Satisfies Constraints",
        "Throughput (infer/sec)",
        "p99 Latency (ms)",
    ]
    assert headers == INFERENCE_COLUMNS
    assert headers[9:] == [
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


def test_inference_csv_rows_sorted_by_settings_then_concurrency(analysis: Analysis, tmp_path: Path) -> None:
    _, rows = _read_csv(write_csv_files(analysis, tmp_path)[0])
    assert [(row["Model Config Path"], row["Concurrency"]) for row in rows] == [
        ("add_sub_config_mbs2_nodb_i2", "1"),
        ("add_sub_config_mbs4_db500_i1", "1"),
        ("add_sub_config_mbs4_db500_i1", "2"),
        ("add_sub_config_mbs8_nodb_i1", "1"),
        ("add_sub_config_mbs8_nodb_i1", "2"),
        ("add_sub_config_mbs8_nodb_i1", "4"),
        ("add_sub_config_mbs8_db100_i2", "1"),
        ("add_sub_config_mbs8_db100_i2", "2"),
        ("add_sub_config_mbs8_db100_i2", "4"),
        ("add_sub_config_mbs16_db0_i4", "1"),
        ("add_sub_config_mbs16_db0_i4", "2"),
    ]
    assert {row["Model"] for row in rows} == {"add_sub"}
    assert {row["Batch"] for row in rows} == {"1"}


def test_inference_csv_row_values(analysis: Analysis, tmp_path: Path) -> None:
    _, rows = _read_csv(write_csv_files(analysis, tmp_path)[0])
    best = rows[8]
    assert best == {
        "Model": "add_sub",
        "Batch": "1",
        "Concurrency": "4",
        "Model Config Path": "add_sub_config_mbs8_db100_i2",
        "Instance Group": "2:CPU",
        "Max Batch Size": "8",
        "Satisfies Constraints": "Yes",
        "Throughput (infer/sec)": "400.25",
        "p99 Latency (ms)": "15.5",
        "p95 Latency (ms)": "13.95",
        "p50 Latency (ms)": "7.75",
        "Avg Latency (ms)": "8.0",
        "Server Queue (ms)": "0.5",
        "Server Compute Input (ms)": "0.125",
        "Server Compute Infer (ms)": "3.875",
        "Server Compute Output (ms)": "0.062",
        "CPU Utilization (%)": "150.0",
        "RAM Usage (MB)": "310.5",
        "Average GPU Utilization (%)": "",  # no GPU
        "Max GPU Memory Usage (MB)": "",
        "Client CPU (%)": "20.0",
        "Dynamic Batching": "Enabled",
        "Max Queue Delay (us)": "100",
        "Failed Requests": "0",
        "Stable": "Yes",
        "Error": "",
    }
    over_budget = rows[5]  # the current settings at concurrency 4: p99 25 ms
    assert (over_budget["Model Config Path"], over_budget["Concurrency"]) == (
        "add_sub_config_mbs8_nodb_i1",
        "4",
    )
    assert over_budget["Satisfies Constraints"] == "No"
    assert over_budget["Dynamic Batching"] == "Disabled"
    assert over_budget["Max Queue Delay (us)"] == ""
    assert over_budget["Instance Group"] == "1:CPU"


def test_inference_csv_failed_settings_is_a_row_with_its_error(analysis: Analysis, tmp_path: Path) -> None:
    _, rows = _read_csv(write_csv_files(analysis, tmp_path)[0])
    failed = rows[0]
    assert failed["Error"] == FAILURE
    assert failed["Satisfies Constraints"] == "No"
    assert failed["Instance Group"] == "2:CPU"
    assert failed["Max Batch Size"] == "2"
    assert failed["Throughput (infer/sec)"] == failed["p99 Latency (ms)"] == ""
    assert [row["Error"] for row in rows[1:]] == [""] * 10


def test_server_usage_not_measured_is_left_blank_not_zero(analysis: Analysis, tmp_path: Path) -> None:
    # A running server measured through --server-url: its processes are not ours to watch.
    unwatched = [dataclasses.replace(p, server_cpu_percent=None, server_rss_mb=None) for p in MEASUREMENTS]
    remote = dataclasses.replace(analysis, measurements=unwatched)
    _, rows = _read_csv(write_csv_files(remote, tmp_path)[0])
    assert {(row["CPU Utilization (%)"], row["RAM Usage (MB)"]) for row in rows} == {("", "")}
    best_row = next(line for line in best_table(remote).splitlines() if line.startswith("1 "))
    assert " - " in best_row and " 150 " not in best_row


def test_gpu_figures_fill_their_columns_and_bound_the_gpu_memory(analysis: Analysis, tmp_path: Path) -> None:
    # A server whose metrics report GPUs: the best settings on the GPU, the others on the CPU.
    on_gpu = dataclasses.replace(BEST, instance_kind=GPU)
    measured = [dataclasses.replace(p, settings=on_gpu) if p.settings == BEST else p for p in MEASUREMENTS]
    measured = [
        dataclasses.replace(p, gpu_utilization_percent=35.25, gpu_memory_mb=900.0 + p.concurrency)
        for p in measured
    ]
    bounded = dataclasses.replace(
        analysis, measurements=measured, constraints=Constraints(latency_budget_ms=20, max_gpu_memory_mb=903)
    )
    _, rows = _read_csv(write_csv_files(bounded, tmp_path)[0])
    row = next(row for row in rows if row["Model Config Path"] == "add_sub_config_mbs8_db100_i2_gpu")
    assert row["Instance Group"] == "2:GPU"
    assert row["Concurrency"] == "1"
    assert (row["Average GPU Utilization (%)"], row["Max GPU Memory Usage (MB)"]) == ("35.25", "901.0")
    # concurrency 4 held 904 MB: over the bound, so the best passing level is 2
    assert bounded.ranking().passing[0].concurrency == 2
    assert Constraints(max_gpu_memory_mb=903).violations(measured[0]) == [
        "GPU memory 904 MB > maximum 903 MB"
    ]
    text = best_table(bounded)
    assert "GPU memory ≤ 903 MB" in text
    assert re.search(r"RSS MB +GPU % +GPU MB +Δ infer/s", text)
    assert " ".join(_table_rows(text)[0].split()).startswith("1 8 100 µs 2 GPU 2 230.0")
    assert write_output_repository(bounded, tmp_path / "out")[0] == "add_sub"
    config = parse_config(
        (tmp_path / "out" / "output_model_repository" / "add_sub" / "config.pbtxt").read_text()
    )
    assert [group.kind for group in config.instance_group] == [ModelInstanceGroup.KIND_GPU]


def test_a_level_that_failed_requests_meets_no_constraint_and_says_so(
    analysis: Analysis, tmp_path: Path
) -> None:
    # Refused requests answer fast and leave no latency: their level must not look best.
    flaky = dataclasses.replace(_point(OVER_BUDGET, 3, 5000.0, 1.0), errors=7, requests=93)
    flaky.extra["stable"] = False
    faulty = dataclasses.replace(analysis, measurements=[*MEASUREMENTS, flaky], constraints=Constraints())
    assert Constraints().violations(flaky) == ["7 of 100 requests failed"]
    assert all(point is not flaky for point in faulty.ranking().passing)
    _, rows = _read_csv(write_csv_files(faulty, tmp_path)[0])
    row = next(row for row in rows if row["Throughput (infer/sec)"] == "5000.0")
    assert (row["Failed Requests"], row["Stable"], row["Satisfies Constraints"]) == ("7", "No", "No")


def test_summary_csv_ranks_passing_settings_then_the_closest(analysis: Analysis, tmp_path: Path) -> None:
    _, rows = _read_csv(write_csv_files(analysis, tmp_path)[1])
    assert [(row["Rank"], row["Model Config Path"], row["Concurrency"]) for row in rows] == [
        ("1", "add_sub_config_mbs8_db100_i2", "4"),
        ("2", "add_sub_config_mbs8_nodb_i1", "2"),
        ("3", "add_sub_config_mbs4_db500_i1", "2"),
        ("4", "add_sub_config_mbs16_db0_i4", "1"),  # over the budget at every level: last, and says why
    ]
    assert [row["Satisfies Constraints"] for row in rows] == ["Yes", "Yes", "Yes", "No"]
    assert [row["Constraint Violations"] for row in rows] == ["", "", "", "p99 30.0 ms > budget 20 ms"]
    assert rows[0]["Throughput (infer/sec)"] == "400.25"
    assert rows[0]["p99 Latency (ms)"] == "15.5"


def test_instance_group_label_counts_per_kind_as_model_analyzer_does() -> None:
    config = parse_config(
        "instance_group [ { kind: KIND_GPU count: 2 gpus: [ 0, 1 ] }, { kind: KIND_CPU count: 1 },"
        " { kind: KIND_CPU count: 3 } ]"
    )
    assert instance_group_label(config) == "4:GPU + 4:CPU"
    assert instance_group_label(parse_config("")) == "1:CPU"


# The terminal table


def _table_rows(text: str) -> list[str]:
    """The table's data lines: those after the dashed rule, up to the first blank line."""
    lines = text.splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith("-")) + 1
    rows = []
    for line in lines[start:]:
        if not line.strip():
            break
        rows.append(line)
    return rows


def test_table_lists_the_best_first_with_change_from_the_current_configuration(analysis: Analysis) -> None:
    text = best_table(analysis)
    assert "p99 latency ≤ 20 ms" in text
    rows = [line.split() for line in _table_rows(text)]
    assert [row[0] for row in rows] == ["1", "2", "3"]
    # #, max batch, dynamic batching, instances, concurrency, infer/s, p50, p95, p99, CPU, RSS, Δ infer/s, Δ p99
    assert " ".join(rows[0]) == "1 8 100 µs 2 4 400.2 7.75 13.95 15.50 150 310 +122% +72%"
    assert " ".join(rows[1]) == "2 8 off 1 2 180.0 4.50 8.10 9.00 150 310 baseline baseline"
    assert rows[2][-2:] == ["-6%", "+22%"]
    assert (
        "'baseline' marks the current configuration (max_batch_size=8, no dynamic batching, 1 instance)"
        in text
    )


def test_table_never_puts_a_settings_over_the_latency_budget_at_the_top(analysis: Analysis) -> None:
    text = best_table(analysis, top=10)
    rows = _table_rows(text)
    assert len(rows) == 3  # the over-budget settings has the highest throughput, and is not listed
    assert not any(row.split()[1] == "16" for row in rows)
    assert "1000.0" not in text and "900.0" not in text


def test_table_says_n_a_where_the_current_configuration_never_passed(analysis: Analysis) -> None:
    text = best_table(_with_budget(analysis, 4.5))  # only BEST at concurrency 1 (p99 4 ms) passes
    rows = [line.split() for line in _table_rows(text)]
    assert len(rows) == 1
    assert rows[0][-2:] == ["n/a", "n/a"]
    assert (
        "the current configuration (max_batch_size=8, no dynamic batching, 1 instance) met the constraints at no load measured"
        in text
    )


def test_table_names_the_constraint_and_the_closest_where_nothing_passes(analysis: Analysis) -> None:
    text = best_table(_with_budget(analysis, 1.0))
    assert text.startswith("No configuration of 'add_sub' meets the constraints (p99 latency ≤ 1 ms).")
    assert "The closest configurations, and what they break:" in text
    rows = _table_rows(text)
    assert len(rows) == 3
    # Nearest first: each settings at its level closest to the budget.
    assert rows[0].split()[:6] == ["8", "100", "µs", "2", "1", "120.5"]
    assert rows[0].endswith("p99 4.0 ms > budget 1 ms")
    assert rows[1].split()[:5] == ["8", "off", "1", "1", "100.0"]
    assert rows[1].endswith("p99 5.0 ms > budget 1 ms")
    assert rows[2].endswith("p99 6.0 ms > budget 1 ms")


def test_table_where_every_settings_failed(analysis: Analysis) -> None:
    text = best_table(dataclasses.replace(analysis, measurements=[Measurement(FAILED, 1, error=FAILURE)]))
    assert "No configuration of 'add_sub' meets the constraints (p99 latency ≤ 20 ms)." in text
    assert "Every configuration failed" in text


def test_table_says_when_the_client_was_the_bottleneck(analysis: Analysis) -> None:
    assert "bottleneck" not in best_table(analysis)
    points = [
        _point(BEST, 4, 400.25, 15.5, client_cpu_percent=93.0)
        if (p.settings, p.concurrency) == (BEST, 4)
        else p
        for p in MEASUREMENTS
    ]
    text = best_table(dataclasses.replace(analysis, measurements=points))
    assert (
        "The load generator used 93% of a core at concurrency 4: the client, not the server, may have been the bottleneck"
        in text
    )


# The output model repository


def test_output_repository_holds_the_best_settings_first(
    analysis: Analysis, model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    names = write_output_repository(analysis, out)
    assert names == ["add_sub", "add_sub_config_1", "add_sub_config_2"]
    repository = out / "output_model_repository"
    assert sorted(path.name for path in repository.iterdir()) == names
    expected = {"add_sub": BEST, "add_sub_config_1": CURRENT, "add_sub_config_2": THIRD}
    base = read_config_file(model_dir / "config.pbtxt")
    for name, settings in expected.items():
        config = parse_config((repository / name / "config.pbtxt").read_text())
        assert config.name == name
        assert config.max_batch_size == settings.max_batch_size
        assert [group.count for group in config.instance_group] == [settings.instance_count]
        assert config.HasField("dynamic_batching") == settings.dynamic_batching
        assert config.dynamic_batching.max_queue_delay_microseconds == settings.max_queue_delay_us
        # The rest of the configuration is the model's own.
        assert config.backend == base.backend
        assert config.input == base.input
        assert config.output == base.output
        assert (repository / name / "1" / "model.onnx").read_bytes() == MODEL_FILE
        assert (repository / name / "labels.txt").read_text() == "sum\ndifference\n"
        assert not (repository / name / "__pycache__").exists()


def test_output_repository_never_holds_a_settings_over_the_budget(analysis: Analysis, tmp_path: Path) -> None:
    names = write_output_repository(analysis, tmp_path, top=10)
    assert len(names) == 3
    for name in names:
        config = parse_config((tmp_path / "output_model_repository" / name / "config.pbtxt").read_text())
        assert config.max_batch_size != OVER_BUDGET.max_batch_size


def test_output_repository_is_empty_where_nothing_passes(analysis: Analysis, tmp_path: Path) -> None:
    assert write_output_repository(analysis, tmp_path) == ["add_sub", "add_sub_config_1", "add_sub_config_2"]
    # A second run, under a budget nothing meets, leaves none of the first run's folders behind.
    assert write_output_repository(_with_budget(analysis, 1.0), tmp_path) == []
    assert list((tmp_path / "output_model_repository").iterdir()) == []
    assert write_output_repository(_with_budget(analysis, 1.0), tmp_path / "fresh") == []
    assert not (tmp_path / "fresh").exists()


def test_output_repository_replaces_an_earlier_runs_folders(analysis: Analysis, tmp_path: Path) -> None:
    repository = tmp_path / "output_model_repository"
    other = write_model(repository, "other_model", MODEL_FILE, ADD_SUB_CONFIG)
    write_output_repository(analysis, tmp_path, top=3)
    assert write_output_repository(analysis, tmp_path, top=1) == ["add_sub"]
    assert sorted(path.name for path in repository.iterdir()) == ["add_sub", "other_model"]
    assert (other / "1" / "model.onnx").read_bytes() == MODEL_FILE  # another model's folder is left alone


def test_output_repository_writes_the_whole_config_where_the_model_had_none(
    analysis: Analysis, model_dir: Path, tmp_path: Path
) -> None:
    """A model without config.pbtxt: its configuration came from the server (auto-completed)."""
    served = read_config_file(model_dir / "config.pbtxt")
    served.name = "add_sub"
    served.default_model_filename = "model.onnx"
    (model_dir / "config.pbtxt").unlink()
    write_output_repository(dataclasses.replace(analysis, base_config=served), tmp_path, top=1)
    config = parse_config((tmp_path / "output_model_repository" / "add_sub" / "config.pbtxt").read_text())
    assert config == BEST.applied_to(served)


def test_output_repository_loads_and_serves_in_coreserve(
    coreserve_server: ServerFactory,
    http_client: Callable[[ServerProcess], httpclient.InferenceServerClient],
    analysis: Analysis,
    tmp_path: Path,
) -> None:
    names = write_output_repository(analysis, tmp_path)
    server = coreserve_server(tmp_path / "output_model_repository")
    client = http_client(server)
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    b = np.full((1, 4), 10, dtype=np.float32)
    expected = {"add_sub": BEST, "add_sub_config_1": CURRENT, "add_sub_config_2": THIRD}
    for name in names:
        assert client.is_model_ready(name), server.log
        config = client.get_model_config(name)
        assert config["max_batch_size"] == expected[name].max_batch_size
        assert [group["count"] for group in config["instance_group"]] == [expected[name].instance_count]
        assert ("dynamic_batching" in config) == expected[name].dynamic_batching
        inputs = [
            httpclient.InferInput("INPUT0", [1, 4], "FP32"),
            httpclient.InferInput("INPUT1", [1, 4], "FP32"),
        ]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        result = client.infer(name, inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


# report.html


def _plot(page: str, div_id: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The traces and layout the page gives Plotly.newPlot for the chart `div_id`."""
    match = re.search(r'Plotly\.newPlot\(\s*"' + re.escape(div_id) + r'",\s*', page)
    assert match, f"no chart {div_id}"
    decoder = json.JSONDecoder()
    traces, end = decoder.raw_decode(page, match.end())
    layout, _ = decoder.raw_decode(page, re.compile(r",\s*").match(page, end).end())  # type: ignore[union-attr]
    return traces, layout


def test_report_is_one_offline_file(analysis: Analysis, tmp_path: Path) -> None:
    path = write_report(analysis, tmp_path / "out")
    assert path == tmp_path / "out" / "report.html"
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["report.html"]
    page = path.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    assert '<script src="http' not in page
    assert not re.search(r"<script[^>]*\ssrc=", page)  # nothing loaded: plotly.js is in the page
    assert "Plotly.newPlot" in page
    assert len(page) > 1_000_000  # plotly.js itself


def test_report_has_the_constraints_and_the_best_configurations(analysis: Analysis, tmp_path: Path) -> None:
    page = write_report(analysis, tmp_path).read_text(encoding="utf-8")
    assert "<h1>coreserve analyze: add_sub</h1>" in page
    assert "p99 latency ≤ 20 ms" in page
    best = page.index("<h2>Best configurations</h2>")
    table = page[best : page.index("</table>", best)]
    assert table.count("<tr>") == 4  # the header and three configurations
    assert table.index("max_batch_size=8, dynamic batching (100 µs), 2 instances") < table.index(
        "max_batch_size=8, no dynamic batching, 1 instance"
    )
    assert "max_batch_size=16" not in table
    assert "<td>400.2</td>" in table and "<td>+122%</td>" in table and "<td>baseline</td>" in table


def test_report_throughput_latency_chart_holds_every_measured_point(
    analysis: Analysis, tmp_path: Path
) -> None:
    page = write_report(analysis, tmp_path).read_text(encoding="utf-8")
    assert 'id="throughput-latency"' in page
    traces, layout = _plot(page, "throughput-latency")
    by_key = {trace["meta"]: trace for trace in traces}
    # The failed settings has no point to draw.
    assert set(by_key) == {BEST.key, CURRENT.key, THIRD.key, OVER_BUDGET.key}
    best = by_key[BEST.key]
    assert (best["x"], best["y"], best["customdata"]) == ([4.0, 8.0, 15.5], [120.5, 230.0, 400.25], [1, 2, 4])
    assert by_key[OVER_BUDGET.key]["x"] == [30.0, 45.0]
    assert by_key[OVER_BUDGET.key]["y"] == [900.0, 1000.0]
    # The top three stand out: thicker lines, and named by their rank.
    assert by_key[BEST.key]["name"].startswith("#1 ")
    assert by_key[CURRENT.key]["name"].startswith("#2 ")
    assert by_key[THIRD.key]["name"].startswith("#3 ")
    assert not by_key[OVER_BUDGET.key]["name"].startswith("#")
    assert by_key[BEST.key]["line"]["width"] > by_key[OVER_BUDGET.key]["line"]["width"]
    budget = [shape for shape in layout["shapes"] if shape["x0"] == shape["x1"] == 20]
    assert len(budget) == 1 and budget[0]["xref"] == "x"


def test_report_draws_the_minimum_throughput(analysis: Analysis, tmp_path: Path) -> None:
    constrained = dataclasses.replace(
        analysis, constraints=Constraints(latency_budget_ms=20, min_throughput=150)
    )
    page = write_report(constrained, tmp_path).read_text(encoding="utf-8")
    _, layout = _plot(page, "throughput-latency")
    assert [shape for shape in layout["shapes"] if shape["y0"] == shape["y1"] == 150 and shape["yref"] == "y"]
    assert "throughput ≥ 150 infer/s" in page


def test_report_latency_split_of_each_best_configuration(analysis: Analysis, tmp_path: Path) -> None:
    page = write_report(analysis, tmp_path).read_text(encoding="utf-8")
    for rank in (1, 2, 3):
        assert f'id="latency-split-{rank}"' in page
    assert 'id="latency-split-4"' not in page
    traces, layout = _plot(page, "latency-split-1")
    assert layout["barmode"] == "stack"
    parts = {trace["name"]: trace for trace in traces}
    assert list(parts) == ["queue", "compute input", "compute infer", "compute output", "client and network"]
    assert parts["queue"]["x"] == ["1", "2", "4"]
    assert parts["compute infer"]["y"] == [1.0, 2.0, 3.875]
    assert parts["compute input"]["y"] == [0.125] * 3
    # What is left of the client's average latency (p99/2 + 0.25) over the server's parts.
    assert parts["client and network"]["y"] == pytest.approx([0.5625, 1.5625, 3.4375])


def test_report_where_nothing_passes_shows_the_closest(analysis: Analysis, tmp_path: Path) -> None:
    page = write_report(_with_budget(analysis, 1.0), tmp_path).read_text(encoding="utf-8")
    assert "No configuration meets the constraints (p99 latency ≤ 1 ms)." in page
    assert "p99 4.0 ms &gt; budget 1 ms" in page
    assert 'id="throughput-latency"' in page
    assert 'id="latency-split-1"' in page  # the closest configuration's split


def test_report_lists_failed_settings_and_escapes_the_models_strings(
    analysis: Analysis, tmp_path: Path
) -> None:
    hostile = dataclasses.replace(analysis, model="add<script>alert(1)</script>&co")
    page = write_report(hostile, tmp_path).read_text(encoding="utf-8")
    assert "add&lt;script&gt;alert(1)&lt;/script&gt;&amp;co" in page
    assert "<script>alert(1)" not in page
    failed = page[page.index('<div id="failed-configurations">') :]
    assert "failed to load &#x27;add_sub&#x27;: &lt;bad &amp; wrong&gt;" in failed
    assert "max_batch_size=2, no dynamic batching, 2 instances" in failed
    assert "<bad & wrong>" not in page
