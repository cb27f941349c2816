"""What dynamic batching gains, and how close it gets to the limit of the framework.

    python benchmarks/batching.py [--seconds 8] [--trials 3]

An MLP where compute dominates: FP32 [N, 1024] through four 2048-wide dense layers with
ReLU. Measured in one run: (a) in-process onnxruntime samples/s at batch 1 and batch 32 (the
limit); (b) the server at client concurrency 32 without dynamic batching; (c) the same with
dynamic batching. Requests are HTTP with binary tensors, one sample each, driven by wrk.
Rounds of (a), (b), (c) repeat --trials times; each figure is the median of its rounds, and
each ratio the median of the ratios within rounds.
Targets: (c) >= 3 x (b) and (c) >= 0.7 x in-process batch 32. Writes
benchmarks/results/batching.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    Load,
    binary_infer_body,
    calls_per_second,
    median,
    median_load,
    mlp_onnx,
    mlp_weights,
    print_table,
    start_server,
    write_model,
    write_results,
    wrk,
)

WIDTH_IN, WIDTH, LAYERS, MAX_BATCH = 1024, 2048, 4, 32
CONFIG = """
backend: "onnxruntime"
max_batch_size: 32
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 1024 ] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ 2048 ] }} ]
{batching}
"""
TARGET_GAIN, TARGET_OF_LIMIT = 3.0, 0.7


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()

    repository = Path(tempfile.mkdtemp(prefix="coreserve-batching-")) / "models"
    model = mlp_onnx(mlp_weights(WIDTH_IN, WIDTH, LAYERS))
    write_model(repository, "mlp", model, CONFIG.format(batching=""))
    write_model(
        repository,
        "mlp_batched",
        model,
        CONFIG.format(batching="dynamic_batching { max_queue_delay_microseconds: 2000 }"),
    )

    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    feeds = {batch: {"x": np.ones((batch, WIDTH_IN), np.float32)} for batch in (1, MAX_BATCH)}
    sample = np.random.default_rng(1).normal(size=(1, WIDTH_IN))
    body, headers = binary_infer_body("x", sample, "y")
    server = start_server(repository, "--allow-metrics=false")
    # Rounds interleave the in-process limit with the server rows, so that a neighbour who
    # slows the machine for a while weighs on both sides of each ratio.
    measured: dict[str, list[float]] = {"1": [], str(MAX_BATCH): []}
    trials: dict[str, list[Load]] = {"mlp": [], "mlp_batched": []}
    try:
        for name in trials:
            wrk(f"http://{server.http_url}/v2/models/{name}/infer", 32, 2, body, headers)  # warm-up
        for _ in range(args.trials):
            for batch, feed in feeds.items():
                rate = calls_per_second(lambda f=feed: session.run(["y"], f), args.seconds / 2)
                measured[str(batch)].append(batch * rate)
            for name in trials:
                url = f"http://{server.http_url}/v2/models/{name}/infer"
                trials[name].append(wrk(url, 32, args.seconds, body, headers))
        limits = {int(batch): median(rates) for batch, rates in measured.items()}
        loads = {name: median_load(runs) for name, runs in trials.items()}
        import tritonclient.http as httpclient

        client = httpclient.InferenceServerClient(server.http_url)
        stats = client.get_inference_statistics("mlp_batched")["model_stats"][0]
        client.close()
    finally:
        server.close()

    unbatched, batched = loads["mlp"], loads["mlp_batched"]
    rows = [
        ["(a) in-process onnxruntime, batch 1", "-", limits[1], "-", "-"],
        ["(a) in-process onnxruntime, batch 32 (the limit)", "-", limits[MAX_BATCH], "-", "-"],
        ["(b) server, no dynamic batching", 32, unbatched.requests_per_s, unbatched.p50_ms, unbatched.p99_ms],
        ["(c) server, dynamic batching", 32, batched.requests_per_s, batched.p50_ms, batched.p99_ms],
    ]
    print_table(
        "MLP [N,1024] -> 4 x 2048 ReLU, HTTP binary, one sample per request (median of trials)",
        ["configuration", "concurrency", "samples/s", "p50 ms", "p99 ms"],
        rows,
    )
    # Ratios are taken within each round, then the median across rounds.
    rounds_of_limit = [
        load.requests_per_s / limit
        for load, limit in zip(trials["mlp_batched"], measured[str(MAX_BATCH)], strict=True)
    ]
    rounds_gain = [
        b.requests_per_s / a.requests_per_s for a, b in zip(trials["mlp"], trials["mlp_batched"], strict=True)
    ]
    gain, of_limit = median(rounds_gain), median(rounds_of_limit)
    average_batch = stats["inference_count"] / max(1, stats["execution_count"])
    print(f"\nin-process batch 32 / batch 1: {limits[MAX_BATCH] / limits[1]:.1f}x")
    print(f"(c) / (b) = {gain:.2f} (target >= {TARGET_GAIN}: {'met' if gain >= TARGET_GAIN else 'MISSED'})")
    print(
        f"(c) / in-process batch 32 = {of_limit:.2f}, rounds {', '.join(f'{r:.2f}' for r in rounds_of_limit)} "
        f"(target >= {TARGET_OF_LIMIT}: {'met' if of_limit >= TARGET_OF_LIMIT else 'MISSED'})"
    )
    print(f"average executed batch size with dynamic batching: {average_batch:.1f}")
    path = write_results(
        "batching",
        {
            "in_process_samples_per_s": {str(k): v for k, v in limits.items()},
            "server_without_batching": unbatched,
            "server_with_dynamic_batching": batched,
            "gain": gain,
            "fraction_of_limit": of_limit,
            "fraction_of_limit_by_round": rounds_of_limit,
            "average_batch_size": average_batch,
            "targets": {"gain": TARGET_GAIN, "fraction_of_limit": TARGET_OF_LIMIT},
        },
    )
    print(f"results: {path}")


if __name__ == "__main__":
    main()
