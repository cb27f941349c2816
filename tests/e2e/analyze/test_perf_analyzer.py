"""`coreserve analyze --perf-analyzer`: the load levels measured by Triton's own perf_analyzer
(from the tritonclient 2.51 wheel: the `perf_analyzer` fixture, which $PERF_ANALYZER names).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.model_builders import identity_model, write_model

from .test_analyze import FAST, IDENTITY, analyze, checkpoint_lines, rows


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("analyze-perf-analyzer")
    write_model(root, "identity", identity_model("FP32", [-1, 4]), IDENTITY)
    return root


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_perf_analyzer_measures_every_load_level(
    perf_analyzer: Path, repository: Path, tmp_path: Path, protocol: str
) -> None:
    done = analyze(
        "--model-repository", repository, "--model", "identity", "--search", "brute", "--output-dir", tmp_path,
        "--max-batch-size", "1", "--max-instance-count", "1", "--perf-analyzer", perf_analyzer,
        "--protocol", protocol, *FAST,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    points = [json.loads(line) for line in checkpoint_lines(tmp_path)[1:]]
    assert points and all(point["extra"]["load_generator"] == "perf_analyzer" for point in points)
    for row in rows(tmp_path):
        assert not row["Error"] and float(row["Throughput (infer/sec)"]) > 0
        # perf_analyzer's own figures: its percentiles in order, the server's split from its statistics
        assert (
            0
            < float(row["p50 Latency (ms)"])
            <= float(row["p95 Latency (ms)"])
            <= float(row["p99 Latency (ms)"])
        )
        assert float(row["Server Compute Infer (ms)"]) > 0
        assert float(row["RAM Usage (MB)"]) > 0  # the server's usage is read around perf_analyzer's run


def test_a_perf_analyzer_that_is_not_there_is_named(repository: Path, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-perf_analyzer"
    done = analyze("--model-repository", repository, "--model", "identity", "--output-dir", tmp_path / "out",
                   "--perf-analyzer", missing, *FAST)  # fmt: skip
    assert done.returncode == 1
    assert "--perf-analyzer" in done.stderr and "not an executable" in done.stderr
    assert "Traceback" not in done.stderr
