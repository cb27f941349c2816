"""What an HTTP/2 attack costs the others, for http2_attacks.py: a well-behaved gRPC client and an
HTTP health probe in a process of their own (so that the attacker's Python does not take the GIL
from them), and the server's resident memory (with its child processes) from /proc.
"""

from __future__ import annotations

import http.client
import multiprocessing
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

MODEL = "identity"
WIDTH = 16


def infer_message() -> bytes:
    """A serialized ModelInferRequest for the identity model: [1, 16] FP32."""
    from coreserve.protos import grpc_service_pb2 as pb

    request = pb.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, WIDTH])
    request.raw_input_contents.append(np.arange(WIDTH, dtype=np.float32).tobytes())
    return request.SerializeToString()


@dataclass
class Target:
    """The server under attack: its addresses, and its process when the script can see it."""

    grpc: str
    http: str
    pid: int | None
    message: bytes = field(default_factory=infer_message)


def tree_pids(pid: int) -> list[int]:
    """`pid` and its living descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rpartition(")")[2].split()[1]), []).append(int(entry))
    found, pending = [], [pid]
    while pending:
        current = pending.pop()
        found.append(current)
        pending.extend(children.get(current, ()))
    return found


def tree_rss_mb(pid: int) -> float:
    total = 0
    for member in tree_pids(pid):
        try:
            for line in Path(f"/proc/{member}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


class Watcher(threading.Thread):
    """A loop in a thread, run until stopped; `sample()` is one turn."""

    interval = 0.1

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            self.sample()
            self.stopping.wait(self.interval)

    def sample(self) -> None:
        raise NotImplementedError

    def stop(self, timeout: float = 15.0) -> None:
        self.stopping.set()
        self.join(timeout)


class GrpcClient(Watcher):
    """A well-behaved client: one infer at a time through tritonclient.grpc."""

    interval = 0.0

    def __init__(self, target: Target) -> None:
        super().__init__()
        self.client = grpcclient.InferenceServerClient(target.grpc)
        tensor = grpcclient.InferInput("INPUT0", [1, WIDTH], "FP32")
        tensor.set_data_from_numpy(np.arange(WIDTH, dtype=np.float32).reshape(1, WIDTH))
        self.inputs = [tensor]
        self.latencies: list[float] = []
        self.errors: Counter[str] = Counter()
        self.examples: dict[str, str] = {}
        self.call()  # the connection is made before the phase starts
        self.latencies.clear()

    def call(self) -> None:
        started = time.perf_counter()
        try:
            self.client.infer(MODEL, self.inputs, client_timeout=10)
        except InferenceServerException as exc:
            code = str(exc.status()).removeprefix("StatusCode.")
            self.errors[code] += 1
            self.examples.setdefault(code, str(exc.message())[:200])
            return
        self.latencies.append(time.perf_counter() - started)

    def sample(self) -> None:
        self.call()

    def stop(self, timeout: float = 15.0) -> None:
        super().stop(timeout)
        self.client.close()


class HealthProbe(Watcher):
    """GETs /v2/health/ready on a new connection every 50 ms."""

    interval = 0.05

    def __init__(self, target: Target) -> None:
        super().__init__()
        self.host, port = target.http.rsplit(":", 1)
        self.port = int(port)
        self.latencies: list[float] = []
        self.failures: Counter[str] = Counter()

    def sample(self) -> None:
        started = time.perf_counter()
        connection = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            connection.request("GET", "/v2/health/ready")
            status = connection.getresponse().status
        except OSError as exc:
            self.failures[type(exc).__name__] += 1
            return
        finally:
            connection.close()
        self.latencies.append(time.perf_counter() - started)
        if status != 200:
            self.failures[f"HTTP {status}"] += 1


class MemorySampler(Watcher):
    """The server's resident memory, with its children's; sets `over` past the limit."""

    def __init__(self, pid: int, limit_mb: float) -> None:
        super().__init__()
        self.pid = pid
        self.limit_mb = limit_mb
        self.peak_mb = 0.0
        self.over = threading.Event()

    def sample(self) -> None:
        rss = tree_rss_mb(self.pid)
        self.peak_mb = max(self.peak_mb, rss)
        if rss > self.limit_mb:
            self.over.set()


def percentiles_ms(latencies: list[float]) -> tuple[float, float, float]:
    if not latencies:
        nan = float("nan")
        return nan, nan, nan
    p50, p99 = np.percentile(latencies, [50, 99])
    return float(p50) * 1000, float(p99) * 1000, max(latencies) * 1000


def measure_victims(target: Target, pipe: Connection) -> None:
    """The other client and the probe, in a process of their own: they start when the pipe
    says so, and send back what they saw when it says "stop"."""
    client, probe = GrpcClient(target), HealthProbe(target)
    pipe.send("ready")
    client.start()
    probe.start()
    pipe.recv()
    client.stop()
    probe.stop()
    p50, p99, worst = percentiles_ms(client.latencies)
    health_p50, health_p99, health_worst = percentiles_ms(probe.latencies)
    pipe.send({
        "client": {"calls": len(client.latencies), "errors": dict(client.errors), "error_examples": client.examples,
                   "p50_ms": p50, "p99_ms": p99, "max_ms": worst},
        "health": {"probes": len(probe.latencies), "failures": dict(probe.failures),
                   "p50_ms": health_p50, "p99_ms": health_p99, "max_ms": health_worst},
    })  # fmt: skip


class Victims:
    """measure_victims in a spawned process."""

    def __init__(self, target: Target) -> None:
        context = multiprocessing.get_context("spawn")
        self.pipe, child = context.Pipe()
        self.process = context.Process(target=measure_victims, args=(target, child), daemon=True)
        self.process.start()
        if not self.pipe.poll(120) or self.pipe.recv() != "ready":
            self.process.kill()
            raise RuntimeError("the measuring client did not start")

    def results(self) -> dict[str, Any]:
        self.pipe.send("stop")
        try:
            if not self.pipe.poll(60):
                raise RuntimeError("the measuring client did not stop")
            return dict(self.pipe.recv())
        finally:
            self.process.join(10)
            if self.process.is_alive():
                self.process.kill()
