"""A model repository in Azure Blob Storage (as://), served from a real Azurite on loopback.

Azurite is the npm package `azurite`: .ci/run installs it into .cache/azurite; elsewhere
$AZURITE names its `azurite-blob`, or `npm install -g azurite` puts it on PATH.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import adlfs  # noqa: F401  (the server's as:// filesystem)
import numpy as np
import pytest
import tritonclient.http as httpclient
from azure.storage import blob

from coreserve.testing import ServerFactory
from support.model_builders import scale_model
from support.waiting import wait_until

from .storage_emulators import (
    AZURITE_ACCOUNT,
    AZURITE_KEY,
    azurite_blob_command,
    azurite_connection_string,
    free_port,
    start_azurite,
)

SCALE = """
backend: "onnxruntime"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
SERVER = [sys.executable, "-m", "coreserve", "--http-port=0", "--grpc-port=0", "--metrics-port=0"]
# A key of the right form (base64 of 64 bytes) that is not Azurite's.
WRONG_KEY = "V3JvbmdLZXlXcm9uZ0tleVdyb25nS2V5V3JvbmdLZXlXcm9uZ0tleVdyb25nS2V5V3JvbmdLZXlXcm9uZ0tleQ=="


@pytest.fixture(scope="module")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An Azurite blob server on a free loopback port: its host:port."""
    command = azurite_blob_command()
    if command is None:
        pytest.skip("Azurite is not installed (npm install azurite; $AZURITE names its azurite-blob)")
    port = free_port()
    process = start_azurite(command, port, tmp_path_factory.mktemp("azurite"))
    yield f"127.0.0.1:{port}"
    process.terminate()
    process.wait(timeout=10)


def _container(endpoint: str, name: str) -> blob.ContainerClient:
    """A new container of Azurite's account, through Azure's own SDK."""
    service = blob.BlobServiceClient.from_connection_string(azurite_connection_string(endpoint))
    return service.create_container(name)


def _scale(client: httpclient.InferenceServerClient) -> float:
    tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    return float(client.infer("scaled", [tensor]).as_numpy("OUTPUT0")[0, 0])


def _start_failing(url: str, env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Runs a server that should refuse to start; returns what it did."""
    return subprocess.run(
        [*SERVER, f"--model-repository={url}", f"--model-cache-dir={tmp_path / 'cache'}"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HOME": str(tmp_path), **env},
    )


def test_serves_and_polls_an_azure_repository(
    coreserve_server: ServerFactory, azurite: str, tmp_path: Path
) -> None:
    container = _container(azurite, "polled")
    container.upload_blob("repo/scaled/config.pbtxt", SCALE.encode())
    container.upload_blob("repo/scaled/1/model.onnx", scale_model(2.0).SerializeToString())
    server = coreserve_server(
        f"as://{AZURITE_ACCOUNT}/polled/repo",
        "--model-control-mode=poll",
        "--repository-poll-secs=0.5",
        f"--model-cache-dir={tmp_path / 'cache'}",
        env={"AZURE_STORAGE_CONNECTION_STRING": azurite_connection_string(azurite), "HOME": str(tmp_path)},
    )
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        assert _scale(client) == 2.0
        assert any((tmp_path / "cache").rglob("model.onnx"))  # fetched into the cache folder
        # A changed blob (same name, same size, new content) reloads the model.
        container.upload_blob(
            "repo/scaled/1/model.onnx", scale_model(3.0).SerializeToString(), overwrite=True
        )
        wait_until(lambda: _scale(client) == 3.0, "the changed blob reloaded", timeout=30)
        # A new version folder is noticed too.
        container.upload_blob("repo/scaled/2/model.onnx", scale_model(4.0).SerializeToString())
        wait_until(lambda: _scale(client) == 4.0, "the new version served", timeout=30)
        assert client.get_model_metadata("scaled")["versions"] == ["2"]
    finally:
        client.close()
    assert AZURITE_KEY not in server.log
    assert "Traceback" not in server.log, server.log[-3000:]


def test_missing_container_is_a_clear_error_at_startup(azurite: str, tmp_path: Path) -> None:
    completed = _start_failing(
        f"as://{AZURITE_ACCOUNT}/nosuchcontainer/repo",
        {"AZURE_STORAGE_CONNECTION_STRING": azurite_connection_string(azurite)},
        tmp_path,
    )
    assert completed.returncode == 1, completed.stderr[-3000:]
    assert (
        f"the container 'nosuchcontainer' does not exist in Azure Storage account '{AZURITE_ACCOUNT}'"
        in completed.stderr
    ), completed.stderr[-3000:]
    assert "Traceback" not in completed.stderr


def test_wrong_credentials_name_the_account_and_never_the_key(azurite: str, tmp_path: Path) -> None:
    _container(azurite, "guarded").upload_blob("repo/scaled/config.pbtxt", SCALE.encode())
    completed = _start_failing(
        f"as://{AZURITE_ACCOUNT}/guarded/repo",
        {"AZURE_STORAGE_CONNECTION_STRING": azurite_connection_string(azurite, key=WRONG_KEY)},
        tmp_path,
    )
    log = completed.stdout + completed.stderr
    assert completed.returncode == 1, log[-3000:]
    assert f"cannot list model repository as://{AZURITE_ACCOUNT}/guarded/repo" in log, log[-3000:]
    assert f"(Azure Storage account '{AZURITE_ACCOUNT}')" in log
    assert "Server failed to authenticate the request" in log
    assert WRONG_KEY not in log
    assert AZURITE_KEY not in log
    assert "Traceback" not in log


def test_unknown_account_is_a_clear_error_at_startup(azurite: str, tmp_path: Path) -> None:
    # Azurite holds only its development account; a real Azure would not resolve the host.
    completed = _start_failing(
        "as://nosuchaccount/models/repo",
        {"AZURE_STORAGE_CONNECTION_STRING": azurite_connection_string(azurite, account="nosuchaccount")},
        tmp_path,
    )
    assert completed.returncode == 1, completed.stderr[-3000:]
    assert "Azure Storage account 'nosuchaccount'" in completed.stderr, completed.stderr[-3000:]
    assert AZURITE_KEY not in completed.stdout + completed.stderr
    assert "Traceback" not in completed.stderr


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("as://devstoreaccount1", "an Azure Storage URL names an account and a container"),
        ("as://devstoreaccount1/", "an Azure Storage URL names an account and a container"),
        ("as:///models/repo", "an Azure Storage URL names an account and a container"),
        ("as://Not_An_Account/models/repo", "'Not_An_Account' is not an Azure Storage account name"),
        ("as://devstoreaccount1/x/repo", "'x' is not an Azure Storage container name"),
    ],
)
def test_malformed_azure_urls_are_refused_at_startup(url: str, words: str, tmp_path: Path) -> None:
    completed = _start_failing(url, {}, tmp_path)
    assert completed.returncode == 1, completed.stderr[-3000:]
    assert f"model repository {url}: {words}" in completed.stderr, completed.stderr[-3000:]
    assert "Traceback" not in completed.stderr


def test_connection_string_for_another_account_is_refused(azurite: str, tmp_path: Path) -> None:
    completed = _start_failing(
        "as://otheraccount/models/repo",
        {"AZURE_STORAGE_CONNECTION_STRING": azurite_connection_string(azurite)},
        tmp_path,
    )
    assert completed.returncode == 1, completed.stderr[-3000:]
    assert (
        f"AZURE_STORAGE_CONNECTION_STRING is for the account '{AZURITE_ACCOUNT}', "
        "the URL names the account 'otheraccount'" in completed.stderr
    ), completed.stderr[-3000:]
    assert AZURITE_KEY not in completed.stdout + completed.stderr
