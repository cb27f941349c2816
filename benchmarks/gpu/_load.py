"""The one load generator every server gets: perf_analyzer 2.51 (the pack carries it to the
device), over gRPC, HTTP binary, HTTP JSON and shared memory (CUDA regions on the device,
system regions in the dry run), alone or several at once."""

from __future__ import annotations

import csv
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from benchmarks.support.load_generators import perf_analyzer

# transport -> perf_analyzer's protocol and options; "shm" takes the plan's kind of region.
TRANSPORTS = {
    "grpc": ("grpc", []),
    "http-binary": ("http", []),
    "http-json": ("http", ["--input-tensor-format=json", "--output-tensor-format=json"]),
    "shm": ("grpc", []),
}


@dataclass
class Point:
    """One perf_analyzer measurement: inferences per second and latencies (ms)."""

    model: str
    transport: str
    concurrency: int
    infer_per_s: float
    p50_ms: float
    p90_ms: float
    p99_ms: float


def binary() -> str:
    found = perf_analyzer()
    if not found:
        raise RuntimeError("perf_analyzer is not installed ($PERF_ANALYZER or on PATH)")
    return found


def _command(model: str, transport: str, url: str, concurrency: int, window_ms: int, shm: str,
             report: Path) -> list[str]:  # fmt: skip
    protocol, options = TRANSPORTS[transport]
    command = [
        binary(), "-m", model, "-i", protocol, "-u", url, "--concurrency-range", str(concurrency),
        "--measurement-interval", str(window_ms), "--stability-percentage", "999", "--max-trials", "6",
        "--async", "-f", str(report), *options,
    ]  # fmt: skip
    if transport == "shm":
        command += [f"--shared-memory={shm}"]
    return command


def _point(model: str, transport: str, concurrency: int, report: Path) -> Point:
    with report.open() as file:
        row = next(csv.DictReader(file))
    return Point(model, transport, concurrency, float(row["Inferences/Second"]), float(row["p50 latency"]) / 1000,
                 float(row["p90 latency"]) / 1000, float(row["p99 latency"]) / 1000)  # fmt: skip


def together(runs: list[tuple[str, str, str, int]], window_ms: int, shm: str = "cuda") -> list[Point]:
    """Runs perf_analyzer once per (model, transport, url, concurrency), all at the same time."""
    with tempfile.TemporaryDirectory() as folder:
        reports = [Path(folder) / f"{index}.csv" for index in range(len(runs))]
        processes = [
            subprocess.Popen(
                _command(m, t, u, c, window_ms, shm, r), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
            for (m, t, u, c), r in zip(runs, reports, strict=True)
        ]
        said = []
        for process in processes:
            try:
                out, _ = process.communicate(timeout=window_ms / 1000 * 10 + 120)
            except subprocess.TimeoutExpired:
                process.kill()
                out, _ = process.communicate()
            said.append(out.decode(errors="replace"))
        for (model, transport, _, concurrency), process, text in zip(runs, processes, said, strict=True):
            if process.returncode != 0:
                raise RuntimeError(
                    f"perf_analyzer ({model}, {transport}, {concurrency}) exited with {process.returncode}:\n{text[-2000:]}"
                )
        return [_point(m, t, c, r) for (m, t, _, c), r in zip(runs, reports, strict=True)]


def measure(
    model: str, transport: str, url: str, concurrency: int, window_ms: int, shm: str = "cuda"
) -> Point:
    """One model driven at `concurrency` over `transport`."""
    return together([(model, transport, url, concurrency)], window_ms, shm)[0]
