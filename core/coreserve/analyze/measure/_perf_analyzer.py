"""A load level measured by Triton's perf_analyzer instead of coreserve's own load generator.

Asked for with --perf-analyzer (the binary, or `perf_analyzer` on PATH): a C++ client costs the
machine less than the Python one, which matters where both share the server's cores.
perf_analyzer applies the same stability rule (windows of --window-seconds, the last three
within 10%, at most --max-windows) and reads the server's statistics itself; its CSV gives the
figures, in microseconds. Where it finds no stable three within the limit it gives up; the level
is then measured again over three windows with any spread accepted, as the own generator takes
its last three (the point says so: `extra["stable"]` is False). The server's CPU and memory
are read around its run as for the own generator; the client's CPU is perf_analyzer's, from
the operating system's account of ended child processes.
"""

from __future__ import annotations

import asyncio
import csv
import resource
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from coreserve.analyze._points import Measurement, ModelSettings
from coreserve.analyze.measure._client import ServerClient, ServerGone
from coreserve.analyze.measure._gpu_metrics import GpuMetrics
from coreserve.analyze.measure._load import STABLE_WITHIN, Windows
from coreserve.analyze.measure._server_process import Usage

UNSTABLE = "Failed to obtain stable measurement"
STARTUP_S = 60.0  # what perf_analyzer may take beyond its windows (start, metadata, warm-up)
ANY_SPREAD = 10_000  # a --stability-percentage that any three windows meet

# Columns of perf_analyzer's CSV that add up to a request's average latency.
LATENCY_PARTS = (
    "Client Send",
    "Network+Server Send/Recv",
    "Server Queue",
    "Server Compute Input",
    "Server Compute Infer",
    "Server Compute Output",
    "Client Recv",
)


async def measure_with_perf_analyzer(
    binary: str,
    client: ServerClient,
    url: str,
    protocol: str,
    model: str,
    settings: ModelSettings,
    concurrency: int,
    windows: Windows,
    shapes: dict[str, list[int]],
    usage: Callable[[], Usage] | None = None,
    gpus: GpuMetrics | None = None,
) -> Measurement:
    """Runs perf_analyzer at one concurrency against `url` (`protocol` grpc or http), its
    inputs of `shapes` (without the batch dimension: perf_analyzer needs them where the model
    says -1)."""
    common = [
        binary,
        "-m", model, "-i", protocol, "-u", url,
        "--concurrency-range", f"{concurrency}:{concurrency}",
        "--measurement-interval", str(max(1, round(windows.seconds * 1000))),
        "--percentile", "99",
        *(f"--shape={name}:{','.join(map(str, dims))}" for name, dims in shapes.items()),
    ]  # fmt: skip
    stable = [
        "--stability-percentage",
        str(round(STABLE_WITHIN * 100)),
        "--max-trials",
        str(windows.max_windows),
    ]
    before = usage() if usage else None
    cpu_before = _children_cpu_s()
    started = time.monotonic()
    point = Measurement(settings, concurrency)
    limit = windows.seconds * (windows.max_windows + 3) + STARTUP_S
    row, said = await _run(common + stable, limit)
    if row is None and UNSTABLE in said:
        point.extra["stable"] = False
        row, said = await _run(
            [*common, "--stability-percentage", str(ANY_SPREAD), "--max-trials", "3"], limit
        )
    wall = time.monotonic() - started
    after = usage() if usage else None
    if row is None:
        if not await client.ready():
            raise ServerGone(f"the server at {client.address} stopped answering")
        point.error = "perf_analyzer failed: " + " / ".join(said.strip().splitlines()[-5:])
        return point
    _fill(point, row)
    point.client_cpu_percent = 100 * (_children_cpu_s() - cpu_before) / wall if wall > 0 else 0.0
    if before is not None and after is not None:
        point.server_cpu_percent = after.cpu_percent_since(before)
        point.server_rss_mb = after.rss_mb
    figures = gpus.figures(started, started + wall) if gpus is not None else None
    if figures is not None:
        point.gpu_utilization_percent = figures.utilization_percent
        point.gpu_memory_mb = figures.memory_used_mb
    point.extra["load_generator"] = "perf_analyzer"
    return point


async def _run(command: list[str], limit_s: float) -> tuple[dict[str, str] | None, str]:
    """perf_analyzer's CSV row, or None; and what it said. It is killed past `limit_s`, or
    when the analysis is interrupted."""
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "perf_analyzer.csv"
        process = await asyncio.create_subprocess_exec(
            *command, "-f", str(report), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        try:
            output, _ = await asyncio.wait_for(process.communicate(), limit_s)
        except TimeoutError:
            return None, f"perf_analyzer gave no result within {limit_s:.0f} s"
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        said = output.decode(errors="replace")
        if process.returncode != 0 or not report.exists():
            return None, said
        with report.open() as file:
            return next(csv.DictReader(file), None), said


def _fill(point: Measurement, row: dict[str, str]) -> None:
    def ms(column: str) -> float:
        return float(row[column]) / 1000

    point.throughput = float(row["Inferences/Second"])
    point.p50_ms, point.p95_ms, point.p99_ms = ms("p50 latency"), ms("p95 latency"), ms("p99 latency")
    point.avg_ms = sum(ms(column) for column in LATENCY_PARTS)
    point.queue_ms = ms("Server Queue")
    point.compute_input_ms = ms("Server Compute Input")
    point.compute_infer_ms = ms("Server Compute Infer")
    point.compute_output_ms = ms("Server Compute Output")


def _children_cpu_s() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime
