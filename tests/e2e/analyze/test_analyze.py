"""`coreserve analyze` run as a user runs it: the command against a real coreserve it starts
(or one already running), on models built here, checked by the files it writes.

The measured figures are whatever this machine gives; the tests check what the command did
with them (every point in the CSV, the budget respected, resumed points not measured again),
never how fast anything was.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from coreserve.analyze._points import ModelSettings
from coreserve.config.parse import read_config_file
from coreserve.server.metrics._system_metrics import GpuMetrics as SystemGpuMetrics
from coreserve.testing import ServerFactory
from support.model_builders import identity_model, scale_model, write_bls_model, write_model
from support.waiting import wait_until

IDENTITY = """
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

# A Python model that refuses batch sizes above 2: a configuration the sweep cannot load.
PICKY_CONFIG = """
backend: "python"
max_batch_size: 1
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
PICKY_MODEL = """
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        if json.loads(args["model_config"])["max_batch_size"] > 2:
            raise ValueError("picky takes batches of 2 at most")

    def execute(self, requests):
        outputs = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            outputs.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", data)]))
        return outputs
"""

SCALE = """
backend: "onnxruntime"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
# An ensemble of two steps of `scale`'s kind, and a BLS model that calls `scale` (model_builders).
TWICE = """
platform: "ensemble"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "scale" model_version: -1 input_map { key: "INPUT0" value: "INPUT0" }
    output_map { key: "OUTPUT0" value: "half" } },
  { model_name: "scale_again" model_version: -1 input_map { key: "INPUT0" value: "half" }
    output_map { key: "OUTPUT0" value: "OUTPUT0" } }
] }
"""

SEQUENCE = "sequence_batching { max_sequence_idle_microseconds: 5000000 }\n"

# Small bounds and short windows: the command's behaviour, not its figures, is under test. The
# instances stay on the CPU where the server has GPUs too (test_gpus_are_swept_and_measured).
FAST = ["--window-seconds", "0.2", "--max-windows", "4", "--max-concurrency", "2", "--instance-kinds", "cpu"]
SMALL = ["--max-batch-size", "2", "--max-instance-count", "2", *FAST]
MA_COLUMNS = [
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
RUN_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("analyze-repository")
    write_model(root, "identity", identity_model("FP32", [-1, 4]), IDENTITY)
    picky = write_model(root, "picky", None, PICKY_CONFIG)
    (picky / "1" / "model.py").write_text(PICKY_MODEL)
    write_model(root, "scale", scale_model(2.0), SCALE)
    write_model(root, "scale_again", scale_model(3.0), SCALE)
    write_model(root, "twice", None, TWICE)
    write_model(root, "nested", None, TWICE.replace('"scale_again"', '"twice"'))
    write_model(root, "counter", identity_model("FP32", [-1, 4]), IDENTITY + SEQUENCE)
    write_bls_model(root)
    return root


def analyze(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "coreserve", "analyze", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )


def rows(out_dir: Path) -> list[dict[str, str]]:
    with (out_dir / "results" / "metrics-model-inference.csv").open() as file:
        return list(csv.DictReader(file))


def checkpoint_lines(out_dir: Path) -> list[str]:
    return (out_dir / "checkpoint.jsonl").read_text().splitlines()


def measured_settings(out_dir: Path) -> set[str]:
    return {
        json.dumps(json.loads(line)["settings"], sort_keys=True) for line in checkpoint_lines(out_dir)[1:]
    }


@pytest.fixture(scope="module")
def brute_run(
    repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    out_dir = tmp_path_factory.mktemp("brute")
    done = analyze(
        "--model-repository",
        repository,
        "--model",
        "identity",
        "--search",
        "brute",
        "--output-dir",
        out_dir,
        *SMALL,
    )
    return out_dir, done


def test_brute_measures_every_settings_and_writes_the_report_csv_and_repository(
    brute_run: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    out_dir, done = brute_run
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    # mbs 1 and 2, dynamic batching off and on, 1 and 2 instances, and the model as found (mbs 8)
    assert len(measured_settings(out_dir)) == 2 * 2 * 2 + 1
    table = rows(out_dir)
    assert list(table[0])[: len(MA_COLUMNS)] == MA_COLUMNS
    assert {row["Model"] for row in table} == {"identity"}
    assert len(table) == len(checkpoint_lines(out_dir)) - 1  # one row per measurement
    assert all(float(row["Throughput (infer/sec)"]) > 0 for row in table)
    assert (out_dir / "report.html").is_file()
    best = read_config_file(out_dir / "output_model_repository" / "identity" / "config.pbtxt")
    assert best.name == "identity" and best.input[0].name == "INPUT0"
    assert "identity" in done.stdout  # the table of the best configurations
    assert "[" in done.stderr and "infer/s" in done.stderr  # the progress lines


def test_a_resumed_analysis_measures_nothing_again(
    brute_run: tuple[Path, subprocess.CompletedProcess[str]], repository: Path
) -> None:
    out_dir, first = brute_run
    assert first.returncode == 0, first.stderr
    before = checkpoint_lines(out_dir)
    again = analyze(
        "--model-repository",
        repository,
        "--model",
        "identity",
        "--search",
        "brute",
        "--output-dir",
        out_dir,
        *SMALL,
    )
    assert again.returncode == 0, again.stderr
    assert checkpoint_lines(out_dir) == before
    progress = [line for line in again.stderr.splitlines() if line.startswith("[")]
    assert len(progress) == len(before) - 1
    assert all(line.endswith("(from the checkpoint)") for line in progress)


def test_a_configuration_past_the_latency_budget_is_never_recommended(
    brute_run: tuple[Path, subprocess.CompletedProcess[str]], repository: Path, tmp_path: Path
) -> None:
    source, first = brute_run
    assert first.returncode == 0, first.stderr
    p99s = sorted(float(row["p99 Latency (ms)"]) for row in rows(source))
    budget = p99s[len(p99s) // 2]  # half the points are past it
    shutil.copy(source / "checkpoint.jsonl", tmp_path / "checkpoint.jsonl")
    done = analyze(
        "--model-repository", repository, "--model", "identity", "--search", "brute",
        "--output-dir", tmp_path, "--latency-budget-ms", str(budget), *SMALL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    table = rows(tmp_path)
    passing = {row["Model Config Path"] for row in table if row["Satisfies Constraints"] == "Yes"}
    assert all(
        float(row["p99 Latency (ms)"]) <= budget for row in table if row["Satisfies Constraints"] == "Yes"
    )
    assert any(float(row["p99 Latency (ms)"]) > budget for row in table)
    recommended = sorted(path.name for path in (tmp_path / "output_model_repository").iterdir())
    assert recommended and recommended[0] == "identity"
    # Each recommended folder is a configuration with a point within the budget.
    for name in recommended:
        config = read_config_file(tmp_path / "output_model_repository" / name / "config.pbtxt")
        assert config.name == name
        assert f"identity_config_{ModelSettings.of(config).key}" in passing


def test_a_budget_nothing_meets_says_so_and_names_the_closest(
    brute_run: tuple[Path, subprocess.CompletedProcess[str]], repository: Path, tmp_path: Path
) -> None:
    source, first = brute_run
    assert first.returncode == 0, first.stderr
    shutil.copy(source / "checkpoint.jsonl", tmp_path / "checkpoint.jsonl")
    done = analyze(
        "--model-repository", repository, "--model", "identity", "--search", "brute",
        "--output-dir", tmp_path, "--latency-budget-ms", "0.0001", *SMALL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "budget" in done.stdout and "closest" in done.stdout.lower()
    assert not (tmp_path / "output_model_repository").exists()
    assert {row["Satisfies Constraints"] for row in rows(tmp_path)} == {"No"}


def test_quick_writes_the_same_outputs_measuring_fewer_settings(
    brute_run: tuple[Path, subprocess.CompletedProcess[str]], repository: Path, tmp_path: Path
) -> None:
    done = analyze(
        "--model-repository",
        repository,
        "--model",
        "identity",
        "--search",
        "quick",
        "--output-dir",
        tmp_path,
        *SMALL,
    )
    assert done.returncode == 0, done.stderr
    assert len(measured_settings(tmp_path)) < len(measured_settings(brute_run[0]))
    assert (tmp_path / "report.html").is_file()
    assert (tmp_path / "output_model_repository" / "identity" / "config.pbtxt").is_file()


def test_a_settings_that_fails_to_load_is_a_row_and_the_sweep_goes_on(
    repository: Path, tmp_path: Path
) -> None:
    done = analyze(
        "--model-repository", repository, "--model", "picky", "--search", "brute", "--output-dir", tmp_path,
        "--max-batch-size", "4", "--max-instance-count", "1", *FAST,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    table = rows(tmp_path)
    failed = [row for row in table if row["Error"]]
    assert {row["Max Batch Size"] for row in failed} == {"4"}  # with and without dynamic batching
    assert len(failed) == 2 and all("picky takes batches of 2 at most" in row["Error"] for row in failed)
    assert {row["Max Batch Size"] for row in table if not row["Error"]} == {"1", "2"}
    assert "Traceback" not in done.stderr


def test_a_nested_ensemble_is_refused_with_the_reason(repository: Path, tmp_path: Path) -> None:
    done = analyze("--model-repository", repository, "--model", "nested", "--output-dir", tmp_path, *FAST)
    assert done.returncode == 1
    assert "step 'twice' that is an ensemble itself" in done.stderr and "Traceback" not in done.stderr


def test_a_sequence_model_is_refused_with_the_reason(repository: Path, tmp_path: Path) -> None:
    done = analyze("--model-repository", repository, "--model", "counter", "--output-dir", tmp_path, *FAST)
    assert done.returncode == 1
    assert "'counter' is a sequence model" in done.stderr and "Traceback" not in done.stderr


def test_an_unknown_model_is_named_with_the_models_there(repository: Path, tmp_path: Path) -> None:
    done = analyze("--model-repository", repository, "--model", "nope", "--output-dir", tmp_path)
    assert done.returncode == 1
    assert "no model 'nope'" in done.stderr and "bls, counter, identity, nested, picky, scale" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "identity"], "give --model-repository"),
        (["--model", "identity", "--server-url", "x:1", "--window-seconds", "0"], "above 0"),
        (["--model", "identity", "--server-url", "x:1", "--max-windows", "2"], "at least 3"),
        (["--model", "identity", "--server-url", "x:1", "--queue-delays-us", "a,b"], "microseconds"),
        (["--model", "identity", "--server-url", "x:1", "--protocol", "http"], "needs --http-url"),
        (
            ["--model", "identity", "--server-url", "x:1", "--max-memory-mb", "10"],
            "needs a server the analysis starts",
        ),
        (["--model", "identity", "--server-url", "x:1", "--composing-models", ","], "model names"),
        (["--model", "identity", "--server-url", "x:1", "--instance-kinds", "tpu"], "expected cpu, gpu"),
        (
            ["--model", "identity", "--model-repository", ".", "--metrics-url", "http://x/"],
            "is for --server-url",
        ),
    ],
)
def test_bad_flags_are_refused_with_the_reason(args: list[str], message: str) -> None:
    done = analyze(*args)
    assert done.returncode == 2 and message in done.stderr


@pytest.mark.parametrize("asked", [["--instance-kinds", "gpu"], ["--max-gpu-memory-mb", "100"]])
def test_gpus_asked_for_where_the_server_reports_none_are_refused(
    repository: Path, tmp_path: Path, asked: list[str]
) -> None:
    done = analyze(
        "--model-repository", repository, "--model", "identity", "--output-dir", tmp_path,
        "--server-arg=--allow-gpu-metrics=false", *asked,
    )  # fmt: skip
    assert done.returncode == 1
    assert f"{asked[0]}" in done.stderr and "no GPU to measure" in done.stderr
    assert "report no GPU" in done.stderr and "Traceback" not in done.stderr


def test_gpus_are_swept_and_measured(repository: Path, tmp_path: Path) -> None:
    gpus, why = SystemGpuMetrics.open()
    if gpus is None:
        pytest.skip(f"no NVML: the server reports GPUs through NVML (nvidia-ml-py) and an NVIDIA GPU: {why}")
    gpus.close()
    done = analyze(
        "--model-repository", repository, "--model", "picky", "--search", "brute", "--output-dir", tmp_path,
        "--max-batch-size", "1", "--max-instance-count", "1", *FAST, "--instance-kinds", "cpu,gpu",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "GPU memory and utilisation read from http://127.0.0.1:" in done.stderr
    table = rows(tmp_path)
    # picky runs on either kind (a Python model's instance on a GPU only names its device)
    assert {row["Instance Group"] for row in table} == {"1:CPU", "1:GPU"}
    assert all(row["Error"] == "" for row in table)
    assert all(float(row["Max GPU Memory Usage (MB)"]) > 0 for row in table)
    assert all(0 <= float(row["Average GPU Utilization (%)"]) <= 100 for row in table)
    assert "GPU MB" in done.stdout


def _server_pid_of(analyzer: subprocess.Popen[str]) -> int | None:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == analyzer.pid:
                return int(entry.name)
    return None


def test_a_server_that_dies_mid_sweep_leaves_a_resumable_analysis(repository: Path, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "coreserve", "analyze", "--model-repository", str(repository), "--model",
               "identity", "--search", "brute", "--output-dir", str(tmp_path), *SMALL]  # fmt: skip
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as analyzer:
        try:
            wait_until(lambda: (tmp_path / "checkpoint.jsonl").exists() and len(checkpoint_lines(tmp_path)) >= 3,
                       "two points measured", timeout=300)  # fmt: skip
            server = _server_pid_of(analyzer)
            assert server is not None
            os.kill(server, signal.SIGKILL)
            _, stderr = analyzer.communicate(timeout=120)
        finally:
            if analyzer.poll() is None:
                analyzer.kill()
    assert analyzer.returncode == 1
    assert "resumes" in stderr and "Traceback" not in stderr
    kept = checkpoint_lines(tmp_path)
    again = analyze(*command[4:])
    assert again.returncode == 0, again.stderr
    assert (
        checkpoint_lines(tmp_path)[: len(kept)] == kept
    )  # what was measured stays, and is not measured again
    resumed = [line for line in again.stderr.splitlines() if line.endswith("(from the checkpoint)")]
    assert len(resumed) == len(kept) - 1


def test_a_running_server_is_measured_as_it_is(
    coreserve_server: ServerFactory, repository: Path, tmp_path: Path
) -> None:
    server = coreserve_server(repository)
    done = analyze(
        "--server-url", server.grpc_url, "--model", "identity", "--output-dir", tmp_path,
        "--model-repository", repository, *FAST,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert len(measured_settings(tmp_path)) == 1  # only the client load was swept
    assert {row["Max Batch Size"] for row in rows(tmp_path)} == {"8"}
    assert {row["RAM Usage (MB)"] for row in rows(tmp_path)} == {""}  # not our process to watch
    assert (tmp_path / "report.html").is_file()


def test_an_ensemble_sweeps_its_steps_instances_together(repository: Path, tmp_path: Path) -> None:
    done = analyze(
        "--model-repository", repository, "--model", "twice", "--search", "brute", "--output-dir", tmp_path,
        "--max-instance-count", "2", *FAST,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    groups = {row["Instance Group"] for row in rows(tmp_path)}
    assert groups == {f"scale {a}:CPU, scale_again {b}:CPU" for a in (1, 2) for b in (1, 2)}
    assert {row["Max Batch Size"] for row in rows(tmp_path)} == {"4"}  # the ensemble's own, as found
    written = tmp_path / "output_model_repository"
    assert sorted(path.name for path in written.iterdir()) == ["scale", "scale_again", "twice"]
    with (tmp_path / "results" / "metrics-model-summary.csv").open() as file:
        first = next(csv.DictReader(file))  # the best: the set written
    counts = {
        name: read_config_file(written / name / "config.pbtxt").instance_group[0].count
        for name in ("scale", "scale_again")
    }
    assert first["Instance Group"] == f"scale {counts['scale']}:CPU, scale_again {counts['scale_again']}:CPU"
    assert read_config_file(written / "twice" / "config.pbtxt").platform == "ensemble"
    best_row = next(line for line in done.stdout.splitlines() if line.startswith("1 "))
    assert best_row.split()[1:3] == ["-", "-"]  # the ensemble's own batch settings were not swept


def test_a_bls_model_sweeps_its_callees_instances_named_on_the_command_line(
    repository: Path, tmp_path: Path
) -> None:
    done = analyze(
        "--model-repository", repository, "--model", "bls", "--composing-models", "scale", "--search", "quick",
        "--output-dir", tmp_path, "--max-batch-size", "2", "--max-instance-count", "2", *FAST,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    groups = {row["Instance Group"] for row in rows(tmp_path)}
    assert {group.split(", ")[1] for group in groups} >= {
        "scale 1:CPU",
        "scale 2:CPU",
    }  # the callee was swept
    assert sorted(path.name for path in (tmp_path / "output_model_repository").iterdir()) == ["bls", "scale"]


def test_the_load_goes_over_http_when_asked(
    coreserve_server: ServerFactory, repository: Path, tmp_path: Path
) -> None:
    # gRPC inference is closed to calls without a key: only the HTTP load can be served.
    server = coreserve_server(repository, "--grpc-restricted-protocol=inference:analyze=yes")
    endpoints = ["--server-url", server.grpc_url, "--http-url", server.http_url, "--model", "identity", *FAST]
    over_http = analyze("--protocol", "http", "--output-dir", tmp_path / "http", *endpoints)
    assert over_http.returncode == 0, over_http.stderr
    served = rows(tmp_path / "http")
    assert served and all(float(row["Throughput (infer/sec)"]) > 0 and not row["Error"] for row in served)
    over_grpc = analyze("--output-dir", tmp_path / "grpc", *endpoints)
    assert over_grpc.returncode == 0, over_grpc.stderr
    refused = rows(tmp_path / "grpc")
    assert [row["Error"].startswith("every request failed") for row in refused] == [True]
