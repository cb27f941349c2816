"""A model repository in S3, served from a real S3-compatible server (moto) on loopback."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerFactory
from support.model_builders import scale_model
from support.servers.s3_server import CREDENTIALS, free_port, s3_client, start_moto

SCALE = """
backend: "onnxruntime"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


@pytest.fixture
def s3_endpoint() -> Iterator[str]:
    """A moto S3 server process on a free loopback port."""
    port = free_port()
    process = start_moto(port)
    yield f"127.0.0.1:{port}"
    process.terminate()
    process.wait(timeout=10)


def _scale(client: httpclient.InferenceServerClient) -> float:
    tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    return float(client.infer("scaled", [tensor]).as_numpy("OUTPUT0")[0, 0])


def test_serves_and_polls_an_s3_repository(
    coreserve_server: ServerFactory, s3_endpoint: str, tmp_path: Path
) -> None:
    s3 = s3_client(s3_endpoint)
    s3.create_bucket(Bucket="models")
    s3.put_object(Bucket="models", Key="repo/scaled/config.pbtxt", Body=SCALE.encode())
    s3.put_object(Bucket="models", Key="repo/scaled/1/model.onnx", Body=scale_model(2.0).SerializeToString())
    env = {**CREDENTIALS, "HOME": str(tmp_path)}
    server = coreserve_server(
        f"s3://{s3_endpoint}/models/repo",
        "--model-control-mode=poll",
        "--repository-poll-secs=0.5",
        f"--model-cache-dir={tmp_path / 'cache'}",
        env=env,
    )
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        assert _scale(client) == 2.0
        assert any((tmp_path / "cache").rglob("model.onnx"))  # fetched into the cache folder
        s3.put_object(
            Bucket="models", Key="repo/scaled/2/model.onnx", Body=scale_model(3.0).SerializeToString()
        )
        deadline = time.monotonic() + 30
        while _scale(client) != 3.0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _scale(client) == 3.0
        assert client.get_model_metadata("scaled")["versions"] == ["2"]
    finally:
        client.close()


def test_missing_filesystem_package_is_a_clear_error(tmp_path: Path) -> None:
    # The test environment has the filesystems of core-server's extras (s3, gcs, azure), so the
    # missing one is fsspec's OCI filesystem; tests/core/repository/storage/test_stores.py checks that
    # each extra the message would name exists.
    completed = subprocess.run(
        [sys.executable, "-m", "coreserve", "--model-repository=oci://bucket/models"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ},
    )
    assert completed.returncode == 1
    assert (
        "model repository oci://bucket/models needs a filesystem package: Install ocifs" in completed.stderr
    ), completed.stderr[-3000:]
    assert "Traceback" not in completed.stderr


def test_served_models_survive_an_s3_outage_and_changes_arrive_after_it(
    coreserve_server: ServerFactory, tmp_path: Path
) -> None:
    port = free_port()
    endpoint = f"127.0.0.1:{port}"
    moto = start_moto(port)
    try:
        s3 = s3_client(endpoint)
        s3.create_bucket(Bucket="models")
        s3.put_object(Bucket="models", Key="repo/scaled/config.pbtxt", Body=SCALE.encode())
        s3.put_object(
            Bucket="models", Key="repo/scaled/1/model.onnx", Body=scale_model(2.0).SerializeToString()
        )
        server = coreserve_server(
            f"s3://{endpoint}/models/repo",
            "--model-control-mode=poll",
            "--repository-poll-secs=0.5",
            f"--model-cache-dir={tmp_path / 'cache'}",
            env={**CREDENTIALS, "HOME": str(tmp_path), "AWS_MAX_ATTEMPTS": "1"},
        )
        client = httpclient.InferenceServerClient(server.http_url)
        try:
            assert _scale(client) == 2.0
            moto.terminate()
            moto.wait(timeout=10)
            outage_started = time.monotonic()
            while time.monotonic() - outage_started < 4:  # several polls meet a dead endpoint
                assert _scale(client) == 2.0
                assert client.is_server_ready()
                time.sleep(0.2)
            # The storage comes back empty (moto keeps nothing; a poll that sees it empty
            # unloads the model, as it should), then holds a new version. Polls fail until it
            # serves the bucket again, however long moto takes to start.
            moto = start_moto(port)
            s3.create_bucket(Bucket="models")
            outage = time.monotonic() - outage_started
            s3.put_object(Bucket="models", Key="repo/scaled/config.pbtxt", Body=SCALE.encode())
            s3.put_object(
                Bucket="models", Key="repo/scaled/2/model.onnx", Body=scale_model(3.0).SerializeToString()
            )
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                with contextlib.suppress(InferenceServerException):
                    if _scale(client) == 3.0:
                        break
                time.sleep(0.2)
            assert _scale(client) == 3.0, server.log[-6000:]
            assert client.get_model_metadata("scaled")["versions"] == ["2"]
        finally:
            client.close()
        log = server.log
        assert "Traceback" not in log, log[-3000:]
        failures = log.count("polling the model repository failed")
        assert 1 <= failures <= outage / 0.5 + 4, log[-3000:]
        assert server.process is not None and server.process.poll() is None
    finally:
        moto.terminate()
        moto.wait(timeout=10)
