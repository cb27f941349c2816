"""A real local Ray cluster for the Ray Serve tests: a head node and a second node on loopback.

Both are `ray start --block` processes of the test, so terminating them stops everything they
started. Each node offers 2 logical CPUs and a small object store (the machine is shared).
Deployments are made with the real command, `coreserve ray`, and reached through Ray Serve's
HTTP proxy on the head node.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from support.servers.s3_server import CREDENTIALS, free_port  # the S3 test's moto server accepts these

RAY = str(Path(sys.executable).parent / "ray")
OBJECT_STORE_BYTES = 80 * 1024 * 1024
START_TIMEOUT_S = 120.0


@dataclass
class RayCluster:
    address: str  # the head's GCS, for `coreserve ray --address`
    serve_port: int  # Ray Serve's HTTP proxy, on the head node
    env: dict[str, str]
    logs: Path

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.serve_port}"


def _start_node(args: Sequence[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [RAY, "start", "--block", "--node-ip-address=127.0.0.1", "--num-cpus=2",
             f"--object-store-memory={OBJECT_STORE_BYTES}", *args],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip


def _alive_nodes(address: str, env: dict[str, str]) -> int:
    probe = (
        "import ray; ray.init(address=%r, logging_level='ERROR'); print(sum(n['Alive'] for n in ray.nodes()))"
    )
    completed = subprocess.run(
        [sys.executable, "-c", probe % address], capture_output=True, text=True, env=env, timeout=60
    )
    return int(completed.stdout.strip().splitlines()[-1]) if completed.returncode == 0 else 0


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Stops a `ray start --block` node: SIGTERM makes it stop the processes it started."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # its own session: only what it started
            process.wait(timeout=30)


def run_cluster() -> Iterator[RayCluster]:
    """Starts a head node and a second node, both on 127.0.0.1; stops them when closed."""
    # Ray's socket paths must fit in 107 bytes: a short folder of its own under /tmp.
    temp = Path(tempfile.mkdtemp(prefix="cs-ray-", dir="/tmp"))
    env = {
        **os.environ,
        **CREDENTIALS,
        "RAY_USAGE_STATS_ENABLED": "0",
        "HOME": str(temp),
        # The one proxy (on the head) would send every request to the head's replica while it
        # has room (Ray's locality preference); spread them over both nodes' replicas instead.
        "RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING": "0",
        # Replicas report their autoscaling metrics twice a second (Ray's default: every 10 s).
        "RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "0.5",
        # A node told to stop stops at once: no drain of up to 30 s for Serve's proxy to quiesce.
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
    }
    port = free_port()
    address = f"127.0.0.1:{port}"
    head = _start_node(
        ["--head", f"--port={port}", "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp}",
         f"--ray-client-server-port={free_port()}"],
        env, temp / "head.log",
    )  # fmt: skip
    nodes = [head]
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while _alive_nodes(address, env) < 1:
            assert time.monotonic() < deadline, (temp / "head.log").read_text()[-3000:]
            assert head.poll() is None, (temp / "head.log").read_text()[-3000:]
            time.sleep(1)
        nodes.append(_start_node([f"--address={address}"], env, temp / "worker.log"))
        while _alive_nodes(address, env) < 2:
            assert time.monotonic() < deadline, (temp / "worker.log").read_text()[-3000:]
            time.sleep(1)
        yield RayCluster(address, free_port(), env, temp)
    finally:
        for node in reversed(nodes):
            _stop(node)
        shutil.rmtree(temp, ignore_errors=True)


class Deployment:
    """A `coreserve ray` process serving a repository on the cluster until `close()`."""

    def __init__(self, cluster: RayCluster, repository: str, *args: str, log: Path) -> None:
        self.cluster = cluster
        self.log = log
        command = [
            sys.executable, "-m", "coreserve", "ray", f"--address={cluster.address}",
            f"--serve-port={cluster.serve_port}", "--proxy-location=HeadOnly", "--replica-cpus=0.5",
            f"--model-repository={repository}", *args,
        ]  # fmt: skip
        with log.open("ab") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=cluster.env)
        deadline = time.monotonic() + START_TIMEOUT_S
        while "coreserve ray: serving at" not in log.read_text(errors="replace"):
            assert self.process.poll() is None, log.read_text(errors="replace")[-4000:]
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-4000:]
            time.sleep(0.5)

    def get(self, path: str) -> tuple[int, dict[str, str], bytes]:
        """A GET through the proxy: status, headers (lower-case names), body."""
        request = urllib.request.Request(f"http://{self.cluster.url}{path}")
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, {k.lower(): v for k, v in answer.headers.items()}, answer.read()
        except urllib.error.HTTPError as error:
            return error.code, {k.lower(): v for k, v in error.headers.items()}, error.read()

    def post(self, path: str, document: object) -> tuple[int, dict[str, str], bytes]:
        request = urllib.request.Request(
            f"http://{self.cluster.url}{path}", data=json.dumps(document).encode(), method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, {k.lower(): v for k, v in answer.headers.items()}, answer.read()
        except urllib.error.HTTPError as error:
            return error.code, {k.lower(): v for k, v in error.headers.items()}, error.read()

    def close(self) -> None:
        """SIGTERM: the command deletes the application (its replicas stop) and exits."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=90)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
