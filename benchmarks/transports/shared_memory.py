"""What system shared memory saves on large tensors: one 16 MiB FP32 input and output.

    python -m benchmarks.transports.shared_memory [--requests 20] [--trials 3]

An ONNX Identity model, called with sequential requests from tritonclient over four paths:
HTTP with binary tensor data, gRPC, and system shared memory with HTTP or gRPC as control
(input and output in registered regions; only the JSON/protobuf header travels). In the
shared-memory paths the client copies its input array into the region before each request
and reads the output from the region (as a numpy view) after it, so its own copy is counted.
The paths' trials alternate; each figure is the median over the trials. MB/s counts the
input and the output (32 MiB per request). Beside it, the server's CPU time per request (from
/proc): what the server spends, apart from what each client library spends.

Where perf_analyzer is installed ($PERF_ANALYZER or on PATH), it drives the two wire paths too
(one request at a time, random data), in the same alternating trials: a client written in C++
on both sides, so that the ratio compares the servers' paths rather than tritonclient's HTTP
and gRPC libraries (the Python gRPC client spends more CPU than the HTTP one on these
messages). Target (issue 16): gRPC >= HTTP binary.
Writes benchmarks/results/shared_memory.json.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

from benchmarks.support.cpu_time import cpu_seconds
from benchmarks.support.load_generators import perf_analyzer, run_perf_analyzer
from benchmarks.support.models import identity_onnx, start_server, write_model
from benchmarks.support.reporting import Table, print_table, write_results

ELEMENTS = 4 * 1024 * 1024  # 16 MiB of FP32
BYTE_SIZE = ELEMENTS * 4
CONFIG = """
backend: "onnxruntime"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
PATHS = ("HTTP binary", "gRPC", "shm, HTTP control", "shm, gRPC control")
ANALYZER_PATHS = ("HTTP binary, perf_analyzer", "gRPC, perf_analyzer")
ANALYZER_SECONDS = 5.0


class SharedMemoryPath:
    """Input and output regions registered once; each call copies the input in and reads the output."""

    def __init__(self, module: Any, client: Any, data: np.ndarray) -> None:
        tag = uuid.uuid4().hex[:8]
        self.client, self.data = client, data
        self.input_key, self.output_key = f"/bench-in-{tag}", f"/bench-out-{tag}"
        self.input = shm.create_shared_memory_region(f"in-{tag}", self.input_key, BYTE_SIZE)
        self.output = shm.create_shared_memory_region(f"out-{tag}", self.output_key, BYTE_SIZE)
        self.names = (f"in-{tag}", f"out-{tag}")
        client.register_system_shared_memory(self.names[0], self.input_key, BYTE_SIZE)
        client.register_system_shared_memory(self.names[1], self.output_key, BYTE_SIZE)
        self.tensor = module.InferInput("INPUT0", [ELEMENTS], "FP32")
        self.tensor.set_shared_memory(self.names[0], BYTE_SIZE)
        self.requested = module.InferRequestedOutput("OUTPUT0")
        self.requested.set_shared_memory(self.names[1], BYTE_SIZE)

    def __call__(self) -> np.ndarray:
        shm.set_shared_memory_region(self.input, [self.data])
        self.client.infer("identity", [self.tensor], outputs=[self.requested])
        result: np.ndarray = shm.get_contents_as_numpy(self.output, np.float32, [ELEMENTS])
        return result

    def close(self) -> None:
        for name in self.names:
            self.client.unregister_system_shared_memory(name)
        shm.destroy_shared_memory_region(self.input)
        shm.destroy_shared_memory_region(self.output)


def wire_call(module: Any, client: Any, data: np.ndarray) -> Callable[[], np.ndarray]:
    tensor = module.InferInput("INPUT0", [ELEMENTS], "FP32")
    if module is httpclient:
        tensor.set_data_from_numpy(data, binary_data=True)
        requested = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)]
    else:
        tensor.set_data_from_numpy(data)
        requested = [grpcclient.InferRequestedOutput("OUTPUT0")]

    def call() -> np.ndarray:
        result: np.ndarray = client.infer("identity", [tensor], outputs=requested).as_numpy("OUTPUT0")
        return result

    return call


def trial(call: Callable[[], np.ndarray], data: np.ndarray, requests: int) -> list[float]:
    np.testing.assert_array_equal(call(), data)  # warm-up, and the answer is right
    latencies = []
    for _ in range(requests):
        started = time.perf_counter()
        call()
        latencies.append(time.perf_counter() - started)
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=20, help="sequential requests per path and trial")
    parser.add_argument("--trials", type=int, default=3, help="alternating trials per path")
    args = parser.parse_args()

    repository = Path(tempfile.mkdtemp(prefix="coreserve-shm-")) / "models"
    write_model(repository, "identity", identity_onnx(), CONFIG)
    server = start_server(repository, "--allow-metrics=false")
    data = np.random.default_rng(0).normal(size=ELEMENTS).astype(np.float32)
    http = httpclient.InferenceServerClient(server.http_url, network_timeout=120, connection_timeout=120)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    shared = [SharedMemoryPath(httpclient, http, data), SharedMemoryPath(grpcclient, grpc, data)]
    calls: dict[str, Callable[[], np.ndarray]] = dict(
        zip(
            PATHS,
            [wire_call(httpclient, http, data), wire_call(grpcclient, grpc, data), *shared],
            strict=True,
        )
    )
    analyzer = perf_analyzer()
    paths = PATHS + (ANALYZER_PATHS if analyzer is not None else ())
    pid = server.process.pid if server.process is not None else 0
    by_path: dict[str, list[list[float]]] = {path: [] for path in paths}
    cpu_ms: dict[str, list[float]] = {path: [] for path in paths}  # the server's, per request

    def served() -> int:
        stats = http.get_inference_statistics("identity")["model_stats"][0]["inference_stats"]
        return int(stats["success"]["count"])

    try:
        for _ in range(args.trials):
            for path in paths:
                before, count = cpu_seconds(pid), served()
                if path in calls:
                    latencies = trial(calls[path], data, args.requests)
                else:
                    assert analyzer is not None
                    protocol, url = (
                        ("http", server.http_url) if path.startswith("HTTP") else ("grpc", server.grpc_url)
                    )
                    load = run_perf_analyzer(
                        analyzer, "identity", protocol, url, 1, ANALYZER_SECONDS, shape={"INPUT0": [ELEMENTS]}
                    )
                    # (as sequential requests at the rate it measured: only their sum counts)
                    latencies = [1 / load.requests_per_s] * max(
                        1, round(load.requests_per_s * ANALYZER_SECONDS)
                    )
                by_path[path].append(latencies)
                cpu_ms[path].append((cpu_seconds(pid) - before) * 1000 / (served() - count))
    finally:
        for path_object in shared:
            path_object.close()
        http.close()
        grpc.close()
        server.close()

    results: dict[str, dict[str, float]] = {}
    for path, trials in by_path.items():
        mb_per_s = [2 * BYTE_SIZE / 1e6 * len(latencies) / sum(latencies) for latencies in trials]
        everything = sorted(latency for latencies in trials for latency in latencies)
        results[path] = {
            "MB_per_s": statistics.median(mb_per_s),
            "p50_ms": everything[len(everything) // 2] * 1000,
            "p99_ms": everything[min(len(everything) - 1, int(len(everything) * 0.99))] * 1000,
            "server_cpu_ms_per_request": statistics.median(cpu_ms[path]),
            "trials_MB_per_s": mb_per_s,  # type: ignore[dict-item]
        }
    rows = []
    for path, r in results.items():
        baseline = results["HTTP binary, perf_analyzer" if "perf_analyzer" in path else "HTTP binary"]
        p50, p99 = ("-", "-") if "perf_analyzer" in path else (r["p50_ms"], r["p99_ms"])
        rows.append(
            [
                path,
                r["MB_per_s"],
                r["MB_per_s"] / baseline["MB_per_s"],
                p50,
                p99,
                r["server_cpu_ms_per_request"],
            ]
        )
    tables: list[Table] = []
    tables.append(
        print_table(
            f"16 MiB FP32 in and out, identity ONNX model, sequential requests ({args.trials} trials of "
            f"{args.requests}, alternating; MB/s counts input + output; perf_analyzer rows against its HTTP row)",
            ["path", "MB/s", "x HTTP binary", "p50 ms", "p99 ms", "server CPU ms/request"],
            rows,
        )
    )
    write_results(
        "shared_memory",
        args,
        tables,
        {"requests": args.requests, "trials": args.trials, "tensor_bytes": BYTE_SIZE, "paths": results},
    )


if __name__ == "__main__":
    main()
