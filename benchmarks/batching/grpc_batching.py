"""The MLP of batching.py with dynamic batching, over gRPC against HTTP binary.

    python -m benchmarks.batching.grpc_batching [--seconds 6] [--rounds 3] [--grpc-server native]

One coreserve process serves batching.py's MLP with dynamic batching (FP32 [N, 1024] through
four 2048-wide dense layers, one sample per request). Each round measures, at concurrency 32,
in an order that rotates from round to round:

- gRPC unary ModelInfer, driven by h2load (nghttp2-client: an HTTP/2 load generator in C, as
  light a client as wrk), 32 connections of one stream each;
- HTTP binary, driven by wrk with batching.py's request body: batching.py's own figure;
- where perf_analyzer is installed ($PERF_ANALYZER), gRPC and HTTP binary driven by it, one
  client for both sides (it costs more CPU per request than h2load or wrk, on the same cores).

Each figure is the median of its rounds; each ratio the median of the per-round ratios.
Target (issue 16): gRPC >= the HTTP binary figure of batching.py (h2load's row / wrk's row).
Writes benchmarks/results/grpc_batching.json.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks.batching.batching import CONFIG, LAYERS, QUEUE_DELAY_US, WIDTH, WIDTH_IN
from benchmarks.support.load_generators import (
    Load,
    grpc_call_succeeds,
    h2load_grpc,
    perf_analyzer,
    retrying,
    run_perf_analyzer,
    wrk,
)
from benchmarks.support.models import binary_infer_body, mlp_onnx, mlp_weights, start_server, write_model
from benchmarks.support.reporting import Table, print_table, write_results
from benchmarks.support.trials import median, rotated

CONCURRENCY = 32
TARGET_RATIO = 1.0
GRPC, HTTP = "gRPC unary (h2load)", "HTTP binary (wrk, batching.py)"
ANALYZER_PATHS = ("gRPC unary (perf_analyzer)", "HTTP binary (perf_analyzer)")
METHOD = "/inference.GRPCInferenceService/ModelInfer"


def infer_message(sample: np.ndarray) -> bytes:
    """A serialized ModelInferRequest for the MLP: one FP32 [1, 1024] input as raw contents."""
    from tritonclient.grpc import service_pb2

    message = service_pb2.ModelInferRequest(model_name="mlp")
    tensor = message.inputs.add(name="x", datatype="FP32")
    tensor.shape.extend(sample.shape)
    message.raw_input_contents.append(np.ascontiguousarray(sample, np.float32).tobytes())
    message.outputs.add(name="y")
    return bytes(message.SerializeToString())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=6.0, help="length of one trial")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of alternating trials")
    parser.add_argument(
        "--grpc-server", choices=("grpcio", "native"), default="native", help="coreserve's --grpc-server"
    )
    args = parser.parse_args()
    analyzer = perf_analyzer()

    repository = Path(tempfile.mkdtemp(prefix="coreserve-grpc-batching-")) / "models"
    batching = f"dynamic_batching {{ max_queue_delay_microseconds: {QUEUE_DELAY_US} }}"
    write_model(
        repository, "mlp", mlp_onnx(mlp_weights(WIDTH_IN, WIDTH, LAYERS)), CONFIG.format(batching=batching)
    )
    sample = np.random.default_rng(1).normal(size=(1, WIDTH_IN))
    body, headers = binary_infer_body("x", sample, "y")
    message = infer_message(sample)
    server = start_server(repository, "--allow-metrics=false", f"--grpc-server={args.grpc_server}")
    url = f"http://{server.http_url}/v2/models/mlp/infer"
    drive: dict[str, Callable[[], Load]] = {
        GRPC: lambda: h2load_grpc(server.grpc_url, METHOD, message, CONCURRENCY, args.seconds),
        HTTP: lambda: wrk(url, CONCURRENCY, args.seconds, body, headers),
    }
    if analyzer is not None:
        drive[ANALYZER_PATHS[0]] = lambda: run_perf_analyzer(
            analyzer, "mlp", "grpc", server.grpc_url, CONCURRENCY, args.seconds
        )
        drive[ANALYZER_PATHS[1]] = lambda: run_perf_analyzer(
            analyzer, "mlp", "http", server.http_url, CONCURRENCY, args.seconds
        )
    paths = tuple(drive)
    rates: dict[str, list[float]] = {path: [] for path in paths}
    errors = 0
    try:
        grpc_call_succeeds(server.grpc_url, METHOD, message)  # h2load sees HTTP statuses only
        wrk(url, CONCURRENCY, 2, body, headers)  # warm-up: the instance's threads, the batcher
        for round_index in range(args.rounds):
            order = rotated(paths, round_index)
            for path in order:
                load = retrying(drive[path])
                rates[path].append(load.requests_per_s)
                errors += load.errors
                print(f"round {round_index + 1} {path}: {load.requests_per_s:,.0f} samples/s", flush=True)
    finally:
        server.close()

    def ratio(ours: str, base: str) -> list[float]:
        return [o / b for o, b in zip(rates[ours], rates[base], strict=True)]

    ratios = {f"{GRPC} / {HTTP}": ratio(GRPC, HTTP)}
    if analyzer is not None:
        ratios[" / ".join(ANALYZER_PATHS)] = ratio(*ANALYZER_PATHS)
    rows = [
        [path, median(values), f"{min(values):,.0f}-{max(values):,.0f}"] for path, values in rates.items()
    ]
    tables: list[Table] = []
    tables.append(
        print_table(
            f"MLP with dynamic batching, concurrency {CONCURRENCY}, --grpc-server={args.grpc_server}, "
            f"median of {args.rounds} alternating rounds",
            ["path", "samples/s", "range"],
            rows,
        )
    )
    against_http = median(ratios[f"{GRPC} / {HTTP}"])
    verdict = "meets" if against_http >= TARGET_RATIO else "MISSES"
    for label, values in ratios.items():
        print(f"{label}: {median(values):.2f} ({min(values):.2f}-{max(values):.2f})")
    print(f"gRPC / HTTP binary of batching.py: {against_http:.2f} ({verdict} the >= {TARGET_RATIO} target); "
          f"errors: {errors}")  # fmt: skip
    written = write_results(
        "grpc_batching",
        args,
        tables,
        {
            "grpc_server": args.grpc_server,
            "concurrency": CONCURRENCY,
            "seconds": args.seconds,
            "samples_per_s_by_round": rates,
            "ratios_by_round": ratios,
            "grpc_to_batching_py_http": against_http,
            "target_ratio": TARGET_RATIO,
            "meets_target": against_http >= TARGET_RATIO,
            "errors": errors,
        },
    )
    print(f"results: {written}")


if __name__ == "__main__":
    main()
