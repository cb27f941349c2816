"""--model-load-retry-count, as Triton's (QA L0_lifecycle test_load_retry): a version that fails
to load is loaded again at once, up to N times, each failure logged in Triton's words; the
load at start-up, through the repository API and on a poll alike."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from coreserve.testing import ServerProcess

CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
# Fails its first FAILURES loads (Triton's retry_model fails its first one), counting each
# attempt in a file beside it; the server process is the same, the stub a new one each time.
FLAKY = """
from pathlib import Path


class TritonPythonModel:
    def initialize(self, args):
        attempts = Path(__file__).with_name("attempts")
        count = int(attempts.read_text()) + 1 if attempts.exists() else 1
        attempts.write_text(str(count))
        if count <= FAILURES:
            raise RuntimeError(f"failing load attempt {count}")

    def execute(self, requests):
        return []
"""


def _flaky(root: Path, name: str, failures: int) -> Path:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(CONFIG)
    (root / name / "1" / "model.py").write_text(FLAKY.replace("FAILURES", str(failures)))
    return root / name / "1" / "attempts"


def _ready(server: ServerProcess, name: str) -> int:
    try:
        with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{name}/ready", timeout=30) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as refused:
        return refused.code


def test_without_retries_a_failed_load_fails_the_start(tmp_path: Path) -> None:
    attempts = _flaky(tmp_path, "retry_model", failures=1)
    server = ServerProcess([tmp_path])
    try:
        with pytest.raises(RuntimeError, match="exited with 1"):
            server.start(timeout=120)
        assert attempts.read_text() == "1"
    finally:
        server.close()


def test_one_retry_serves_a_model_that_fails_once(tmp_path: Path) -> None:
    attempts = _flaky(tmp_path, "retry_model", failures=1)
    server = ServerProcess([tmp_path], ["--model-load-retry-count=1"]).start(timeout=120)
    try:
        assert _ready(server, "retry_model") == 200
        assert attempts.read_text() == "2"
        assert server.log.count("failed to load 'retry_model' version 1: ") == 1
        assert "RuntimeError: failing load attempt 1" in server.log
        assert "successfully loaded 'retry_model'" in server.log
        assert "Traceback" not in server.log
    finally:
        server.close()


def test_a_version_that_keeps_failing_is_tried_count_plus_one_times_then_unavailable(tmp_path: Path) -> None:
    attempts = _flaky(tmp_path, "broken", failures=100)
    _flaky(tmp_path, "healthy", failures=0)
    server = ServerProcess([tmp_path], ["--model-load-retry-count=2", "--exit-on-error=false"]).start(
        timeout=120
    )
    try:
        assert attempts.read_text() == "3"
        assert server.log.count("failed to load 'broken' version 1: ") == 3  # each with its own reason
        for attempt in (1, 2, 3):
            assert f"RuntimeError: failing load attempt {attempt}" in server.log
        assert "failing load attempt 4" not in server.log
        assert (_ready(server, "broken"), _ready(server, "healthy")) == (400, 200)
        request = urllib.request.Request(f"http://{server.http_url}/v2/repository/index", data=b"{}")
        with urllib.request.urlopen(request, timeout=30) as answer:
            index = {entry["name"]: entry for entry in json.load(answer)}
        assert index["broken"]["state"] == "UNAVAILABLE"
        assert "RuntimeError: failing load attempt 3" in index["broken"]["reason"]  # the last one's
    finally:
        server.close()


def test_a_load_through_the_repository_api_is_retried_too(tmp_path: Path) -> None:
    attempts = _flaky(tmp_path, "retry_model", failures=2)
    server = ServerProcess([tmp_path], ["--model-control-mode=explicit", "--model-load-retry-count=2"]).start(
        timeout=120
    )
    try:
        assert not attempts.exists()  # explicit mode loads nothing at start
        request = urllib.request.Request(
            f"http://{server.http_url}/v2/repository/models/retry_model/load", data=b"{}"
        )
        with urllib.request.urlopen(request, timeout=120) as answer:
            assert answer.status == 200
        assert attempts.read_text() == "3"
        assert _ready(server, "retry_model") == 200
    finally:
        server.close()
