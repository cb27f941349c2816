"""A Triton model.py served by coreserve's plugin-python and by Triton's python backend.

    python -m benchmarks.python.python_speed --triton-cmd ../shared/tools/real-tritonserver \\
        [--seconds 5] [--rounds 3] [--concurrency 1 8 32] [--protocols http grpc ...]

The same model.py (adds one to an FP32 [1, 4] tensor), one instance, in both servers. Each
round runs one trial per server, protocol and concurrency, coreserve and Triton back to back
in an order that alternates from round to round, so that a neighbour who loads the shared
machine weighs on both sides of a ratio. The load generators, each on the same cores as the
servers (equally for both):
- http: HTTP JSON through wrk;
- grpc: gRPC through the Python grpc.aio load generator of load_generators.py (the issue's
  row: it spends more CPU per request than either server, on the same cores);
- grpc-h2load: gRPC through h2load (a client in C, as light as wrk), one stream per connection;
- grpc-perf_analyzer: gRPC through perf_analyzer, where installed ($PERF_ANALYZER).
Each figure is the median of its rounds; each ratio (coreserve / Triton) the median of the
per-round ratios. Target (issue 15): >= 1.0 at every concurrency. A second table gives the CPU
time each side spent per request: the server with its stub processes, and the load generator
(each trial's CPU time over its requests, counted as its rate times its wall time: startup
included, so a little low). On 2 cores the three share the machine, so a side that spends less
leaves more to the others. The load average is printed with the results: figures taken on a
loaded machine are only comparable within one run.
Without --triton-cmd (or $TRITON_CMD) only coreserve is measured.
Writes benchmarks/results/python_speed.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.support.cpu_time import load_generator_cpu_seconds, tree_cpu_seconds
from benchmarks.support.load_generators import (
    Load,
    grpc_call_succeeds,
    grpc_load,
    h2load_grpc,
    perf_analyzer,
    run_perf_analyzer,
    wrk,
)
from benchmarks.support.models import start_server
from benchmarks.support.reporting import Table, print_table, write_results
from benchmarks.support.trials import median, median_load
from benchmarks.transports.overhead import free_port

MODEL = "add_one"
CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1, 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1, 4 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
MODEL_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", data + 1)]))
        return responses
"""
TARGET_RATIO = 1.0
METHOD = "/inference.GRPCInferenceService/ModelInfer"
PROTOCOLS = ("http", "grpc", "grpc-h2load", "grpc-perf_analyzer")
JSON_BODY = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}]}
).encode()


def write_repository(repository: Path) -> None:
    (repository / MODEL / "1").mkdir(parents=True, exist_ok=True)
    (repository / MODEL / "config.pbtxt").write_text(CONFIG)
    (repository / MODEL / "1" / "model.py").write_text(MODEL_PY)


def start_triton(command: str, repository: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    """Starts Triton on free ports; returns it, its HTTP base URL and its gRPC address."""
    http, grpc, metrics = (free_port() for _ in range(3))
    process = subprocess.Popen(
        [
            *shlex.split(command),
            f"--model-repository={repository}",
            f"--http-port={http}",
            f"--grpc-port={grpc}",
            f"--metrics-port={metrics}",
            "--log-verbose=0",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/models/{MODEL}/ready", timeout=2):
                return process, f"http://127.0.0.1:{http}", f"127.0.0.1:{grpc}"
        except OSError:
            if process.poll() is not None:
                break
            time.sleep(1)
    process.kill()
    raise SystemExit(f"Triton ({command}) did not serve {MODEL}")


def grpc_request() -> Any:
    from coreserve.protos import grpc_service_pb2 as pb

    request = pb.ModelInferRequest(model_name=MODEL)
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
    request.raw_input_contents.append(np.arange(4, dtype=np.float32).tobytes())
    del tensor
    return request


def measured(pid: int, run: Callable[[], Load]) -> tuple[Load, float, float]:
    """A trial, with the CPU µs per request spent by server `pid` (its stubs included) and by
    the load generator."""
    server, generator = tree_cpu_seconds(pid), load_generator_cpu_seconds()
    started = time.perf_counter()
    load = run()
    served = max(load.requests_per_s * (time.perf_counter() - started), 1.0)
    return (
        load,
        (tree_cpu_seconds(pid) - server) * 1e6 / served,
        (load_generator_cpu_seconds() - generator) * 1e6 / served,
    )


def check_answers(http_url: str) -> None:
    """Both servers must compute the same thing: one request through HTTP, checked."""
    request = urllib.request.Request(
        f"{http_url}/v2/models/{MODEL}/infer", data=JSON_BODY, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        output = json.load(response)["outputs"][0]["data"]
    if output != [2.0, 3.0, 4.0, 5.0]:
        raise SystemExit(f"{http_url} answered {output}, not [2, 3, 4, 5]")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each trial")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of alternating trials")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    analyzer = perf_analyzer()
    parser.add_argument(
        "--protocols",
        nargs="+",
        default=[p for p in PROTOCOLS if analyzer or p != "grpc-perf_analyzer"],
        choices=PROTOCOLS,
        help="load generators (default: all; perf_analyzer where installed)",
    )
    parser.add_argument(
        "--triton-cmd",
        default=os.environ.get("TRITON_CMD"),
        help="command that starts tritonserver (default $TRITON_CMD; none: coreserve only)",
    )
    args = parser.parse_args()
    if "grpc-perf_analyzer" in args.protocols and not analyzer:
        raise SystemExit("grpc-perf_analyzer: perf_analyzer is not installed (set $PERF_ANALYZER)")

    base = Path(tempfile.mkdtemp(prefix="coreserve-python-speed-"))
    write_repository(base / "models")
    # Metrics on, as Triton runs here (on against off: see the benchmark docs).
    server = start_server(base / "models")
    urls = {"coreserve": (f"http://{server.http_url}", server.grpc_url)}
    assert server.process is not None
    pids = {"coreserve": server.process.pid}
    triton = None
    if args.triton_cmd:
        write_repository(base / "triton")
        triton, http_url, grpc_url = start_triton(args.triton_cmd, base / "triton")
        urls["Triton"] = (http_url, grpc_url)
        pids["Triton"] = triton.pid
    request = grpc_request()
    message = request.SerializeToString()
    drive: dict[str, Callable[[str, str, int], Load]] = {
        "http": lambda http_url, _grpc, c: wrk(
            f"{http_url}/v2/models/{MODEL}/infer",
            c,
            args.seconds,
            JSON_BODY,
            {"Content-Type": "application/json"},
        ),
        "grpc": lambda _http, grpc_url, c: grpc_load(grpc_url, request, c, args.seconds),
        "grpc-h2load": lambda _http, grpc_url, c: h2load_grpc(grpc_url, METHOD, message, c, args.seconds),
        "grpc-perf_analyzer": lambda _http, grpc_url, c: run_perf_analyzer(
            analyzer or "", MODEL, "grpc", grpc_url, c, args.seconds
        ),
    }
    trials: dict[tuple[str, str, int], list[Load]] = {}
    cpu: dict[tuple[str, str, int], list[tuple[float, float]]] = {}  # (server, generator) µs
    loads_avg: list[float] = []
    try:
        for http_url, grpc_url in urls.values():
            check_answers(http_url)
            grpc_call_succeeds(grpc_url, METHOD, message)  # h2load reads HTTP statuses only
        for round_index in range(args.rounds):
            order = list(urls) if round_index % 2 == 0 else list(reversed(urls))
            for protocol in args.protocols:
                for concurrency in args.concurrency:
                    for name in order:
                        load, server_us, generator_us = measured(
                            pids[name], partial(drive[protocol], *urls[name], concurrency)
                        )
                        trials.setdefault((name, protocol, concurrency), []).append(load)
                        cpu.setdefault((name, protocol, concurrency), []).append((server_us, generator_us))
                        print(
                            f"round {round_index + 1} {name:9} {protocol:18} c={concurrency:<3} "
                            f"{load.requests_per_s:8.0f} req/s p50 {load.p50_ms:.2f} ms "
                            f"errors {load.errors} (load average {os.getloadavg()[0]:.1f})",
                            flush=True,
                        )
            loads_avg.append(os.getloadavg()[0])
    finally:
        server.close()
        if triton is not None:
            triton.terminate()
            triton.wait(30)

    rows, cpu_rows = [], []
    results: dict[str, object] = {}
    for protocol in args.protocols:
        for concurrency in args.concurrency:
            ours = trials[("coreserve", protocol, concurrency)]
            row: list[object] = [
                protocol,
                concurrency,
                median_load(ours).requests_per_s,
                median_load(ours).p50_ms,
            ]
            entry: dict[str, object] = {"coreserve": [load.requests_per_s for load in ours]}
            cpu_row: list[object] = [protocol, concurrency]
            for name in urls:
                spent = cpu[(name, protocol, concurrency)]
                server_us, generator_us = median([s for s, _ in spent]), median([g for _, g in spent])
                cpu_row += [server_us, generator_us]
                entry[f"{name.lower()}_cpu_us_per_request"] = {
                    "server": server_us,
                    "load_generator": generator_us,
                }
            cpu_rows.append(cpu_row)
            if "Triton" in urls:
                theirs = trials[("Triton", protocol, concurrency)]
                ratios = [a.requests_per_s / b.requests_per_s for a, b in zip(ours, theirs, strict=True)]
                ratio = median(ratios)
                verdict = "meets" if ratio >= TARGET_RATIO else "MISSES"
                row += [
                    median_load(theirs).requests_per_s,
                    median_load(theirs).p50_ms,
                    f"{ratio:.2f} ({min(ratios):.2f}-{max(ratios):.2f}) {verdict}",
                ]
                entry |= {"triton": [load.requests_per_s for load in theirs], "ratio": ratio}
            rows.append(row)
            results[f"{protocol} c={concurrency}"] = entry
    columns = ["protocol", "concurrency", "coreserve req/s", "coreserve p50 ms"]
    if "Triton" in urls:
        columns += ["Triton req/s", "Triton p50 ms", f"ratio (target >= {TARGET_RATIO})"]
    tables: list[Table] = []
    tables.append(
        print_table(f"add-one model.py, one instance (load average {median(loads_avg):.1f})", columns, rows)
    )
    cpu_columns = ["protocol", "concurrency"]
    for name in urls:
        cpu_columns += [f"{name} server+stub", f"{name} load generator"]
    tables.append(print_table("CPU µs per request (medians of the rounds)", cpu_columns, cpu_rows))
    path = write_results("python_speed", args, tables, {"results": results, "load_average": loads_avg})
    print(f"results: {path}")


if __name__ == "__main__":
    main()
