"""Servers of several workers for the tests of tests/e2e/workers:
their repository, starting them, and requests each on a connection of its own.

Each new connection may land on any worker (the kernel spreads them over the shared port), so
the tests open a new connection per request where "every worker" matters: over 40 connections
the chance that one worker got them all is 2**-39.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import socket
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from coreserve.testing import ServerProcess
from support.model_builders import (
    ACCUMULATOR_SEQUENCE_CONFIG,
    ADD_SUB_CONFIG,
    accumulator_model,
    add_sub_model,
    scale_model,
    write_model,
)
from support.waiting import wait_until

CONNECTIONS = 40


SCALE_CONFIG = """
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


ADD_BODY = json.dumps(
    {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
            {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": [1, 1, 1, 1]},
        ]
    }
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_workers(
    repository: Path, *args: str, workers: int = 2, env: dict[str, str] | None = None
) -> ServerProcess:
    # Explicit mode with add_sub loaded, unless the test names another mode (--load-model needs explicit).
    mode = [] if any(arg.startswith("--model-control-mode") for arg in args) else [
        "--model-control-mode=explicit", "--load-model=add_sub"
    ]  # fmt: skip
    server = ServerProcess(
        [repository],
        [
            f"--http-port={free_port()}",
            f"--grpc-port={free_port()}",
            f"--http-thread-count={workers}",
            f"--grpc-infer-thread-count={workers}",
            *mode,
            *args,
        ],
        env,
    ).start(timeout=120)
    wait_until(lambda: status_of(server, "GET", "/v2/health/ready") == 200, "every worker ready", timeout=120)
    return server


def answer_of(server: ServerProcess, method: str, path: str, body: str | None = None) -> tuple[int, bytes]:
    """One request on a connection of its own: it may land on any worker."""
    host, port = server.http_url.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request(method, path, body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def status_of(server: ServerProcess, method: str, path: str, body: str | None = None) -> int:
    try:
        return answer_of(server, method, path, body)[0]
    except OSError:
        return 0


def worker_pids(server: ServerProcess) -> list[int]:
    """The supervisor's children: its workers."""
    assert server.process is not None
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if parent == server.process.pid:
                children.append(int(entry.name))
    return sorted(children)


def worker_of(server: ServerProcess, connection: http.client.HTTPConnection) -> int | None:
    """The worker that holds the server's end of an open, answered HTTP connection (from the
    kernel's socket table and the workers' descriptors); None where none holds it."""
    assert connection.sock is not None
    server_port = int(server.http_url.rsplit(":", 1)[1])
    client_port = connection.sock.getsockname()[1]
    inodes = [
        fields[9]
        for fields in (line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:])
        if int(fields[1].rsplit(":", 1)[1], 16) == server_port
        and int(fields[2].rsplit(":", 1)[1], 16) == client_port
    ]
    held = {f"socket:[{inode}]" for inode in inodes}
    for pid in worker_pids(server):
        with contextlib.suppress(OSError):  # (a descriptor closed meanwhile)
            if any(os.readlink(fd) in held for fd in Path(f"/proc/{pid}/fd").iterdir()):
                return pid
    return None


def worker_role(pid: int) -> list[str]:
    """A worker's CORESERVE_WORKER value, from the environment it started with: index, count,
    the supervisor's socket."""
    variables = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    role = next(v for v in variables if v.startswith(b"CORESERVE_WORKER="))
    return role.split(b"=", 1)[1].decode().split("/", 2)


def worker_index(pid: int) -> int:
    """Which worker a process is."""
    return int(worker_role(pid)[0])


def urlopen_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as answer:
        return str(answer.read().decode())


def sequence_step(
    server: ServerProcess,
    sequence_id: int,
    value: int,
    *,
    start: bool,
    end: bool,
    grpc: bool,
    model: str = "counter",
) -> int:
    """One request of a sequence on a connection of its own (it may land on any worker)."""
    module: Any = grpcclient if grpc else httpclient
    with module.InferenceServerClient(server.grpc_url if grpc else server.http_url) as client:
        tensor = module.InferInput("INPUT", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[value]], np.int32))
        result = client.infer(
            model, [tensor], sequence_id=sequence_id, sequence_start=start, sequence_end=end
        )
    assert int(result.as_numpy("CORR_OUT")[0, 0]) == sequence_id
    return int(result.as_numpy("OUTPUT")[0, 0])


def write_repository(root: Path) -> Path:
    """add_sub, scale, the `counter` sequence model, and the Python sequence and decoupled
    models of the cancellation tests (one 2 s a request, one 6 s to load, one a decoupled
    sequence model)."""
    write_model(root, "add_sub", add_sub_model(), ADD_SUB_CONFIG)
    write_model(root, "scale", scale_model(2.0), SCALE_CONFIG)
    write_model(root, "counter", accumulator_model(), ACCUMULATOR_SEQUENCE_CONFIG)
    models = Path(__file__).parent / "cancellation_models"
    shutil.copytree(models / "sleepy_sequence", root / "sleepy_sequence")
    # The same, 6 s to load: its load on demand takes a while.
    shutil.copytree(models / "sleepy_sequence", root / "slow_sequence")
    with (root / "slow_sequence" / "1" / "model.py").open("a") as source:
        source.write("\n    def initialize(self, args):\n        time.sleep(6)\n")
    # Here 2 s a request: a cancel passed on through worker 0 has time to come before the end.
    sleepy = root / "sleepy_sequence" / "1" / "model.py"
    text = sleepy.read_text()
    assert "SECONDS = 0.5\n" in text
    sleepy.write_text(text.replace("SECONDS = 0.5\n", "SECONDS = 2.0\n", 1))
    # A decoupled model made single-copy by a sequence batcher: its responses are sent on.
    shutil.copytree(models / "streamer", root / "sequence_streamer")
    with (root / "sequence_streamer" / "config.pbtxt").open("a") as config:
        config.write("sequence_batching { }\n")
    return root
