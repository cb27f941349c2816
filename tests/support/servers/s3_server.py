"""A real S3-compatible server (moto) on loopback for the tests that read repositories from S3."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from typing import Any

# What every client of the moto server (boto3 here, s3fs in the servers) authenticates with.
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_moto(port: int) -> subprocess.Popen[bytes]:
    """A moto S3 server process on 127.0.0.1:`port`, once it accepts connections."""
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return process
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise TimeoutError("moto did not start")


def s3_client(endpoint: str) -> Any:
    """A boto3 S3 client of the moto server at `endpoint` (host:port)."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=f"http://{endpoint}",
        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
    )
