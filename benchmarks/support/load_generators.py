"""The load generators the benchmarks drive a server with, and what they measured (Load).

wrk (HTTP, with wrk_report.lua), h2load (unary gRPC), perf_analyzer (Triton's own client, HTTP
and gRPC), a Python grpc.aio client for machines without perf_analyzer, and a loop that calls
a function in this process. The C generators (wrk, h2load) cost the server's cores least.
"""

from __future__ import annotations

import asyncio
import csv
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

WRK_SCRIPT = Path(__file__).with_name("wrk_report.lua")


@dataclass
class Load:
    """What a load generator measured: throughput and latency percentiles."""

    requests_per_s: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    errors: int = 0
    tool: str = ""


def wrk(
    url: str,
    concurrency: int,
    seconds: float,
    body: bytes,
    headers: dict[str, str] | None = None,
    *,
    threads: int = 1,
) -> Load:
    """Drives an HTTP POST endpoint with wrk (`threads` threads, `concurrency` connections)."""
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (Debian: apt-get install wrk)")
    with tempfile.NamedTemporaryFile(suffix=".body") as file:
        file.write(body)
        file.flush()
        env = {
            **os.environ,
            "WRK_BODY_FILE": file.name,
            "WRK_HEADERS": "|".join(f"{k}: {v}" for k, v in (headers or {}).items()),
        }
        completed = subprocess.run(
            [
                "wrk",
                f"-t{min(threads, concurrency)}",
                f"-c{concurrency}",
                f"-d{max(1, round(seconds))}s",
                "--timeout",
                "10s",
                "-s",
                str(WRK_SCRIPT),
                url,
            ],
            capture_output=True,
            text=True,
            env=env,
            check=True,
            timeout=seconds + 60,
        )
    return wrk_load(completed)


def wrk_load(completed: subprocess.CompletedProcess[str]) -> Load:
    """The Load of a wrk run that used wrk_report.lua (its `WRK_JSON {...}` summary line)."""
    match = re.search(r"WRK_JSON (\{.*\})", completed.stdout)
    if match is None:
        raise RuntimeError(f"wrk printed no summary:\n{completed.stdout}\n{completed.stderr}")
    report = json.loads(match.group(1))
    return Load(
        requests_per_s=report["requests"] / (report["duration_us"] / 1e6),
        p50_ms=report["p50_us"] / 1000,
        p90_ms=report["p90_us"] / 1000,
        p99_ms=report["p99_us"] / 1000,
        errors=report["errors"],
        tool="wrk",
    )


def retrying(measure: Callable[[], Load], attempts: int = 3) -> Load:
    """A measurement, tried again when its load generator fails (perf_analyzer gives up when its
    windows differ too much, as a neighbour's burst makes them)."""
    for attempt in range(attempts):
        try:
            return measure()
        except subprocess.CalledProcessError as exc:
            print(f"{exc.cmd[0]} failed (attempt {attempt + 1}): {str(exc.stdout)[-300:]}", flush=True)
    raise SystemExit("the load generator failed every attempt")


def h2load_grpc(
    address: str,
    method: str,
    message: bytes,
    concurrency: int,
    seconds: float,
    *,
    tls: bool = False,
    threads: int = 1,
) -> Load:
    """Drives a unary gRPC method with h2load (nghttp2's HTTP/2 load generator, written in C
    like wrk: Debian's nghttp2-client), `concurrency` connections of one stream each, every
    call carrying the serialized `message`; `tls`: over TLS (h2load checks no certificate).

    h2load reads HTTP statuses, not gRPC's grpc-status trailer: check once that `message`
    succeeds (see grpc_call_succeeds) before measuring with it.
    """
    if shutil.which("h2load") is None:
        raise SystemExit("h2load is not installed (Debian: apt-get install nghttp2-client)")
    with tempfile.TemporaryDirectory() as folder:
        body, log = Path(folder) / "body", Path(folder) / "log"
        body.write_bytes(b"\0" + len(message).to_bytes(4, "big") + message)  # one gRPC frame
        completed = subprocess.run(
            ["h2load", f"-c{concurrency}", f"-t{min(threads, concurrency)}", "-m1", f"-D{max(1, round(seconds))}", "-d", str(body),
             "-H", "content-type: application/grpc", "-H", "te: trailers", f"--log-file={log}",
             f"{'https' if tls else 'http'}://{address}/{method.lstrip('/')}"],
            capture_output=True, text=True, check=True, timeout=seconds + 60,
        )  # fmt: skip
        # Each line: start (us since the epoch), HTTP status, microseconds to the end of the response.
        rows = [line.split("\t") for line in log.read_text().splitlines() if line]
    match = re.search(r"finished in [\d.]+s, ([\d.]+) req/s", completed.stdout)
    if match is None:
        raise RuntimeError(f"h2load printed no summary:\n{completed.stdout}\n{completed.stderr}")
    latencies = np.array(sorted(int(row[2]) for row in rows), dtype=np.float64) / 1000
    return Load(
        requests_per_s=float(match.group(1)),
        p50_ms=float(np.percentile(latencies, 50)) if len(latencies) else 0.0,
        p90_ms=float(np.percentile(latencies, 90)) if len(latencies) else 0.0,
        p99_ms=float(np.percentile(latencies, 99)) if len(latencies) else 0.0,
        errors=sum(1 for row in rows if not row[1].startswith("2")),
        tool="h2load",
    )


def grpc_call_succeeds(address: str, method: str, message: bytes) -> None:
    """Calls a unary method once with a serialized message; raises if it does not answer OK."""
    import grpc

    with grpc.insecure_channel(address) as channel:
        channel.unary_unary(method)(message, timeout=30)  # bytes in and out: no (de)serializers


def perf_analyzer() -> str | None:
    """The perf_analyzer binary: $PERF_ANALYZER, or perf_analyzer on PATH."""
    return os.environ.get("PERF_ANALYZER") or shutil.which("perf_analyzer")


def run_perf_analyzer(
    binary: str,
    model: str,
    protocol: str,
    url: str,
    concurrency: int,
    seconds: float,
    shape: dict[str, list[int]] | None = None,
    extra: Sequence[str] = (),
) -> Load:
    """Drives a model with perf_analyzer (binary tensors, random data) and reads its CSV.

    `extra`: more perf_analyzer options, such as `--streaming`.
    """
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.csv"
        command = [
            binary,
            "-m",
            model,
            "-i",
            protocol,
            "-u",
            url,
            "--concurrency-range",
            str(concurrency),
            "--measurement-interval",
            str(int(seconds * 1000)),
            "--stability-percentage",
            "100",
            "--max-trials",
            "3",
            "-f",
            str(report),
        ]
        for name, dims in (shape or {}).items():
            command += ["--shape", f"{name}:{','.join(map(str, dims))}"]
        command += extra
        completed = subprocess.run(command, capture_output=True, text=True, timeout=seconds * 10 + 120)
        if completed.returncode != 0:
            said = (completed.stdout + completed.stderr)[-2000:]
            raise RuntimeError(f"perf_analyzer exited with {completed.returncode}:\n{said}")
        with report.open() as file:
            row = next(csv.DictReader(file))
    return Load(
        requests_per_s=float(row["Inferences/Second"]),
        p50_ms=float(row["p50 latency"]) / 1000,
        p90_ms=float(row["p90 latency"]) / 1000,
        p99_ms=float(row["p99 latency"]) / 1000,
        tool="perf_analyzer",
    )


def grpc_load(url: str, request: object, concurrency: int, seconds: float) -> Load:
    """Our own gRPC load generator: `concurrency` coroutines repeating one ModelInferRequest.

    Used where perf_analyzer is not installed. It runs in Python on the same machine, so it
    takes CPU from the server and understates what the server can do.
    """
    import grpc

    from coreserve.protos import grpc_service_pb2_grpc as pb_grpc

    async def run() -> tuple[list[float], int]:
        latencies: list[float] = []
        errors = 0
        async with grpc.aio.insecure_channel(url) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
            deadline = time.perf_counter() + seconds

            async def worker() -> None:
                nonlocal errors
                while time.perf_counter() < deadline:
                    started = time.perf_counter()
                    try:
                        await stub.ModelInfer(request)
                    except grpc.RpcError:
                        errors += 1
                        continue
                    latencies.append(time.perf_counter() - started)

            await asyncio.gather(*(worker() for _ in range(concurrency)))
        return latencies, errors

    started = time.perf_counter()
    latencies, errors = asyncio.run(run())
    elapsed = time.perf_counter() - started
    points = np.percentile(latencies, [50, 90, 99]) * 1000 if latencies else [0, 0, 0]
    return Load(
        len(latencies) / elapsed,
        float(points[0]),
        float(points[1]),
        float(points[2]),
        errors,
        tool="python grpc.aio client",
    )


def calls_per_second(call: Callable[[], object], seconds: float) -> float:
    """How often `call` runs per second in this process (after a short warm-up)."""
    for _ in range(20):
        call()
    count = 0
    started = time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        call()
        count += 1
    return count / elapsed
