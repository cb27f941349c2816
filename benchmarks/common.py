"""Shared parts of the benchmarks: models, servers, load generators, tables and JSON results.

Every benchmark compares numbers measured in one run on one machine; the machine is shared
and noisy, so each figure is the median of several trials and conclusions rest on ratios.
"""

from __future__ import annotations

import asyncio
import csv
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from coreserve.testing import ServerProcess

BENCHMARKS = Path(__file__).resolve().parent
RESULTS = BENCHMARKS / "results"
WRK_SCRIPT = BENCHMARKS / "wrk_report.lua"


@dataclass
class Load:
    """What a load generator measured: throughput and latency percentiles."""

    requests_per_s: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    errors: int = 0
    tool: str = ""


def median_load(loads: Sequence[Load]) -> Load:
    """The trial with the median throughput (its latencies belong to it)."""
    ordered = sorted(loads, key=lambda load: load.requests_per_s)
    return ordered[len(ordered) // 2]


def mlp_weights(width_in: int, width: int, layers: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(weight [fan_in, width], bias [width]) per dense layer, the same on every call."""
    rng = np.random.default_rng(0)
    weights = []
    for layer in range(layers):
        fan_in = width_in if layer == 0 else width
        weight = rng.normal(0, fan_in**-0.5, size=(fan_in, width)).astype(np.float32)
        weights.append((weight, rng.normal(0, 0.1, size=width).astype(np.float32)))
    return weights


def mlp_onnx(weights: Sequence[tuple[np.ndarray, np.ndarray]]) -> bytes:
    """An ONNX MLP `x` [N, fan_in] -> `y` [N, width]: Gemm and ReLU per layer."""
    from onnx import TensorProto, helper, numpy_helper

    nodes, initializers, current = [], [], "x"
    for layer, (weight, bias) in enumerate(weights):
        initializers += [
            numpy_helper.from_array(weight, f"w{layer}"),
            numpy_helper.from_array(bias, f"b{layer}"),
        ]
        output = "y" if layer == len(weights) - 1 else f"r{layer}"
        nodes += [
            helper.make_node("Gemm", [current, f"w{layer}", f"b{layer}"], [f"h{layer}"]),
            helper.make_node("Relu", [f"h{layer}"], [output]),
        ]
        current = output
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", weights[0][0].shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", weights[-1][0].shape[1]])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def binary_infer_body(input_name: str, array: np.ndarray, output_name: str) -> tuple[bytes, dict[str, str]]:
    """An HTTP infer body with one FP32 input and one output, both as binary tensor data."""
    data = np.ascontiguousarray(array, dtype=np.float32)
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": input_name,
                    "shape": list(data.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": data.nbytes},
                }
            ],
            "outputs": [{"name": output_name, "parameters": {"binary_data": True}}],
        }
    ).encode()
    return header + data.tobytes(), {
        "Inference-Header-Content-Length": str(len(header)),
        "Content-Type": "application/octet-stream",
    }


def write_model(repository: Path, name: str, model_bytes: bytes, config: str) -> None:
    (repository / name / "1").mkdir(parents=True, exist_ok=True)
    (repository / name / "config.pbtxt").write_text(config)
    (repository / name / "1" / "model.onnx").write_bytes(model_bytes)


def start_server(repository: Path, *args: str) -> ServerProcess:
    """A coreserve process on free loopback ports (see coreserve.testing.ServerProcess)."""
    return ServerProcess([repository], ["--log-verbose=0", *args]).start(timeout=120)


def wrk(
    url: str, concurrency: int, seconds: float, body: bytes, headers: dict[str, str] | None = None
) -> Load:
    """Drives an HTTP POST endpoint with wrk (one thread, `concurrency` connections)."""
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
                "-t1",
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
    address: str, method: str, message: bytes, concurrency: int, seconds: float, *, tls: bool = False
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
            ["h2load", f"-c{concurrency}", "-m1", f"-D{max(1, round(seconds))}", "-d", str(body),
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


def identity_onnx(dims: Sequence[str | int] = ("n",)) -> bytes:
    """An ONNX model whose OUTPUT0 is its FP32 INPUT0 of `dims` (names for any size)."""
    from onnx import TensorProto, helper

    info = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, list(dims))  # noqa: E731
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        "identity",
        [info("INPUT0")],
        [info("OUTPUT0")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


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
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
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


def rotated(paths: tuple[str, ...], round_index: int) -> tuple[str, ...]:
    """The order of a round's trials: `paths` rotated by the round's index, so that each path
    runs first, second, ... in turn and a neighbour slowing the machine weighs on all alike."""
    shift = round_index % len(paths)
    return paths[shift:] + paths[:shift]


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    cells = [[str(c) for c in columns]] + [[_format(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    print(f"\n{title}")
    for index, row in enumerate(cells):
        print(
            "  ".join(
                cell.rjust(width) if i else cell.ljust(width)
                for i, (cell, width) in enumerate(zip(row, widths, strict=True))
            )
        )
        if index == 0:
            print("  ".join("-" * width for width in widths))


def _format(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def write_results(name: str, results: dict[str, object]) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    document = {
        "benchmark": name,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
        },
        **results,
    }
    path.write_text(json.dumps(document, indent=2, default=lambda o: asdict(o)))
    return path
