"""Real Azure Blob Storage (Azurite) and Google Cloud Storage (gcp-storage-emulator) servers on
loopback, for the tests that read repositories from as:// and gs:// (S3's moto is s3_server)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from support.paths import REPO
from support.servers.s3_server import free_port

# Azurite's well-known development account (the same in every Azurite; not a secret).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
# Where .ci/run installs Azurite with npm (`npm install --prefix .cache/azurite azurite`).
_LOCAL_AZURITE = REPO / ".cache/azurite/node_modules/.bin/azurite-blob"

__all__ = [
    "AZURITE_ACCOUNT",
    "AZURITE_KEY",
    "azurite_blob_command",
    "azurite_connection_string",
    "free_port",
    "start_azurite",
    "start_gcs_emulator",
]


def azurite_blob_command() -> str | None:
    """Azurite's blob server: $AZURITE, else `azurite-blob` on PATH (npm -g), else .cache/azurite's."""
    named = os.environ.get("AZURITE")
    if named:
        return named
    return shutil.which("azurite-blob") or (str(_LOCAL_AZURITE) if _LOCAL_AZURITE.exists() else None)


def azurite_connection_string(endpoint: str, account: str = AZURITE_ACCOUNT, key: str = AZURITE_KEY) -> str:
    """A connection string for `account` at an Azurite blob server on `endpoint` (host:port)."""
    return (
        f"DefaultEndpointsProtocol=http;AccountName={account};AccountKey={key};"
        f"BlobEndpoint=http://{endpoint}/{account};"
    )


def _wait_for(process: subprocess.Popen[bytes], port: int, name: str) -> subprocess.Popen[bytes]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return process
        except OSError:
            time.sleep(0.1)
    process.kill()
    process.wait(timeout=10)
    raise TimeoutError(f"{name} did not start on port {port}")


def start_azurite(command: str, port: int, folder: Path) -> subprocess.Popen[bytes]:
    """An Azurite blob server on 127.0.0.1:`port` keeping its data in `folder`, once it accepts."""
    process = subprocess.Popen(
        [
            command,
            "--blobHost=127.0.0.1",
            f"--blobPort={port}",
            f"--location={folder}",
            "--silent",
            "--skipApiVersionCheck",  # newer clients than the Azurite release are fine here
            "--disableTelemetry",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return _wait_for(process, port, "Azurite")


def start_gcs_emulator(port: int) -> subprocess.Popen[bytes]:
    """A gcp-storage-emulator on 127.0.0.1:`port`, in memory, once it accepts connections."""
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "gcp_storage_emulator", "start"),
            *("--host=127.0.0.1", f"--port={port}", "--in-memory", "--quiet"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return _wait_for(process, port, "gcp-storage-emulator")
