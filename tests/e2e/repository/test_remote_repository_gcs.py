"""A model repository in Google Cloud Storage (gs://), served from a real GCS emulator
(gcp-storage-emulator) on loopback, which gcsfs finds through STORAGE_EMULATOR_HOST."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import gcp_storage_emulator  # noqa: F401  (the emulator's process runs it)
import gcsfs
import numpy as np
import pytest
import tritonclient.http as httpclient

from coreserve.testing import ServerFactory
from support.model_builders import scale_model
from support.waiting import wait_until

from .storage_emulators import free_port, start_gcs_emulator

SCALE = """
backend: "onnxruntime"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


@pytest.fixture(scope="module")
def gcs_emulator() -> Iterator[str]:
    """A GCS emulator on a free loopback port: its URL, as STORAGE_EMULATOR_HOST takes it."""
    port = free_port()
    process = start_gcs_emulator(port)
    yield f"http://127.0.0.1:{port}"
    process.terminate()
    process.wait(timeout=10)


def _filesystem(emulator: str) -> object:
    """The test's own client of the emulator: gcsfs's plain filesystem, anonymous."""
    return gcsfs.core.GCSFileSystem(endpoint_url=emulator, token="anon", skip_instance_cache=True)


def _scale(client: httpclient.InferenceServerClient) -> float:
    tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    return float(client.infer("scaled", [tensor]).as_numpy("OUTPUT0")[0, 0])


def test_serves_and_polls_a_gcs_repository(
    coreserve_server: ServerFactory, gcs_emulator: str, tmp_path: Path
) -> None:
    fs = _filesystem(gcs_emulator)
    fs.mkdir("polled")
    fs.pipe("polled/repo/scaled/config.pbtxt", SCALE.encode())
    fs.pipe("polled/repo/scaled/1/model.onnx", scale_model(2.0).SerializeToString())
    server = coreserve_server(
        "gs://polled/repo",
        "--model-control-mode=poll",
        "--repository-poll-secs=0.5",
        f"--model-cache-dir={tmp_path / 'cache'}",
        env={"STORAGE_EMULATOR_HOST": gcs_emulator, "HOME": str(tmp_path)},
    )
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        assert _scale(client) == 2.0
        assert any((tmp_path / "cache").rglob("model.onnx"))  # fetched into the cache folder
        fs.pipe("polled/repo/scaled/1/model.onnx", scale_model(3.0).SerializeToString())
        wait_until(lambda: _scale(client) == 3.0, "the changed object reloaded", timeout=30)
        fs.pipe("polled/repo/scaled/2/model.onnx", scale_model(4.0).SerializeToString())
        wait_until(lambda: _scale(client) == 4.0, "the new version served", timeout=30)
        assert client.get_model_metadata("scaled")["versions"] == ["2"]
    finally:
        client.close()
    assert "Traceback" not in server.log, server.log[-3000:]


def test_missing_bucket_is_a_clear_error_at_startup(gcs_emulator: str, tmp_path: Path) -> None:
    completed = subprocess.run(
        [
            *(sys.executable, "-m", "coreserve", "--model-repository=gs://nosuchbucket/repo"),
            *(
                "--http-port=0",
                "--grpc-port=0",
                "--metrics-port=0",
                f"--model-cache-dir={tmp_path / 'cache'}",
            ),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "STORAGE_EMULATOR_HOST": gcs_emulator, "HOME": str(tmp_path)},
    )
    assert completed.returncode == 1, completed.stderr[-3000:]
    assert (
        "model repository gs://nosuchbucket/repo: the bucket 'nosuchbucket' does not exist"
        in completed.stderr
    )
    assert "Traceback" not in completed.stderr
