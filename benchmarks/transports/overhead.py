"""What the server's request path costs: a tiny model over HTTP JSON, HTTP binary and gRPC.

    python -m benchmarks.transports.overhead [--seconds 5] [--trials 3]

The model adds two FP32 [1, 4] tensors, so nearly all the time is the server's own. Each row
is the median of the trials. The reference is `bare_server.py`: a single-process
aiohttp+uvloop handler that parses v2 JSON with orjson and runs onnxruntime inline, driven
the same way (wrk, one thread, 32 connections), its trials alternating with coreserve's. The
target is coreserve HTTP JSON at concurrency 32 >= 0.75 x the bare handler. gRPC is driven
by perf_analyzer when it is installed ($PERF_ANALYZER or PATH), else by a Python client that
competes for the CPU.
Writes benchmarks/results/overhead.json.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, ValueInfoProto, helper

from benchmarks.support.load_generators import (
    Load,
    calls_per_second,
    grpc_load,
    perf_analyzer,
    run_perf_analyzer,
    wrk,
)
from benchmarks.support.models import start_server, write_model
from benchmarks.support.reporting import Table, print_table, write_results
from benchmarks.support.trials import median, median_load

CONCURRENCIES = (1, 8, 32)
TARGET_RATIO = 0.75
CONFIG = """
backend: "onnxruntime"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1, 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 1, 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1, 4 ] } ]
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
"""


def add_model() -> bytes:
    def info(name: str) -> ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 4])

    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"])],
        "add",
        [info("INPUT0"), info("INPUT1")],
        [info("OUTPUT0")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def json_body() -> bytes:
    data = [1.0, 2.0, 3.0, 4.0]
    return json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": data},
                {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": data},
            ]
        }
    ).encode()


def binary_body() -> tuple[bytes, dict[str, str]]:
    header = json.dumps(
        {
            "inputs": [
                {"name": name, "shape": [1, 4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}
                for name in ("INPUT0", "INPUT1")
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()
    data = np.arange(4, dtype=np.float32).tobytes()
    return header + data + data, {
        "Inference-Header-Content-Length": str(len(header)),
        "Content-Type": "application/octet-stream",
    }


def grpc_request() -> object:
    from coreserve.protos import grpc_service_pb2 as pb

    request = pb.ModelInferRequest(model_name="add")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="FP32", shape=[1, 4])
        request.raw_input_contents.append(np.arange(4, dtype=np.float32).tobytes())
    return request


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def trials(count: int, measure) -> Load:  # type: ignore[no-untyped-def]
    return median_load([measure() for _ in range(count)])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="length of one trial")
    parser.add_argument("--trials", type=int, default=3, help="trials per row (the median is reported)")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="coreserve-overhead-"))
    repository = workdir / "models"
    write_model(repository, "add", add_model(), CONFIG)
    model_file = repository / "add" / "1" / "model.onnx"

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(model_file), options, providers=["CPUExecutionProvider"])
    feeds = {"INPUT0": np.ones((1, 4), np.float32), "INPUT1": np.ones((1, 4), np.float32)}
    in_process = calls_per_second(lambda: session.run(["OUTPUT0"], feeds), args.seconds)

    port = free_port()
    bare = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("bare_server.py")), str(model_file), str(port)]
    )
    server = start_server(repository)
    rows: dict[str, dict[int, Load]] = {"HTTP JSON": {}, "HTTP binary": {}, "gRPC": {}}
    analyzer = perf_analyzer()
    try:
        time.sleep(2.0)
        bare_url = f"http://127.0.0.1:{port}/v2/models/add/infer"
        url = f"http://{server.http_url}/v2/models/add/infer"
        # The target pair alternates trial by trial, so that a neighbour who slows the machine
        # for a while weighs on both sides of the ratio.
        pairs = [
            (wrk(bare_url, 32, args.seconds, json_body()), wrk(url, 32, args.seconds, json_body()))
            for _ in range(args.trials)
        ]
        bare_load = median_load([bare_side for bare_side, _ in pairs])
        rows["HTTP JSON"][32] = median_load([ours for _, ours in pairs])
        ratio = median([ours.requests_per_s / bare_side.requests_per_s for bare_side, ours in pairs])
        body, headers = binary_body()
        for concurrency in CONCURRENCIES:
            if concurrency not in rows["HTTP JSON"]:
                rows["HTTP JSON"][concurrency] = trials(
                    args.trials, lambda c=concurrency: wrk(url, c, args.seconds, json_body())
                )
            rows["HTTP binary"][concurrency] = trials(
                args.trials, lambda c=concurrency: wrk(url, c, args.seconds, body, headers)
            )
            if analyzer:
                rows["gRPC"][concurrency] = trials(
                    args.trials,
                    lambda c=concurrency: run_perf_analyzer(
                        analyzer, "add", "grpc", server.grpc_url, c, args.seconds
                    ),
                )
            else:
                rows["gRPC"][concurrency] = trials(
                    args.trials,
                    lambda c=concurrency: grpc_load(server.grpc_url, grpc_request(), c, args.seconds),
                )
    finally:
        server.close()
        bare.terminate()
        bare.wait()

    table = [["in-process onnxruntime (1 thread)", "-", in_process, "-", "-", "call"]]
    table.append(
        [
            "bare aiohttp handler, HTTP JSON",
            32,
            bare_load.requests_per_s,
            bare_load.p50_ms,
            bare_load.p99_ms,
            bare_load.tool,
        ]
    )
    for transport, loads in rows.items():
        for concurrency, load in sorted(loads.items()):
            table.append(
                [
                    f"coreserve {transport}",
                    concurrency,
                    load.requests_per_s,
                    load.p50_ms,
                    load.p99_ms,
                    load.tool,
                ]
            )
    tables: list[Table] = []
    tables.append(
        print_table(
            "Tiny model (add of two FP32 [1,4]): requests/s and latency (median of trials)",
            ["path", "concurrency", "req/s", "p50 ms", "p99 ms", "driver"],
            table,
        )
    )
    verdict = "meets" if ratio >= TARGET_RATIO else "MISSES"
    print(
        f"\ncoreserve HTTP JSON / bare handler at concurrency 32 (median of alternating trials): {ratio:.2f} "
        f"({verdict} the {TARGET_RATIO} target)"
    )
    path = write_results(
        "overhead",
        args,
        tables,
        {
            "in_process_calls_per_s": in_process,
            "bare_http_json_c32": bare_load,
            "coreserve": {
                transport: {str(c): load for c, load in loads.items()} for transport, loads in rows.items()
            },
            "ratio_http_json_c32_to_bare": ratio,
            "target_ratio": TARGET_RATIO,
        },
    )
    print(f"results: {path}")


if __name__ == "__main__":
    main()
