"""What dynamic batching gains, and how close it gets to the limit of the framework.

    python -m benchmarks.batching.batching [--seconds 8] [--trials 3]

An MLP where compute dominates: FP32 [N, 1024] through four 2048-wide dense layers with
ReLU. Measured in one run: (a) in-process onnxruntime samples/s at batch 1 and batch 32 (the
limit); (b) the server at client concurrency 32 without dynamic batching; (c) the same with
dynamic batching. Requests are HTTP with binary tensors, one sample each, driven by wrk.
Rounds of (a), (b), (c) repeat --trials times; each figure is the median of its rounds, and
each ratio the median of the ratios within rounds.
Targets: (c) >= 3 x (b) and (c) >= 0.7 x in-process batch 32.

It also accounts for the CPU time of (c) per request: the server's event loop (HTTP,
scheduling, responses), its other threads (onnxruntime's), and the load generator. Their sum
bounds what the machine's cores can serve even if all of it overlapped, and shows where a
missed target comes from. Writes benchmarks/results/batching.json.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from benchmarks.support.cpu_time import children_cpu_seconds, thread_cpu_seconds
from benchmarks.support.load_generators import Load, wrk
from benchmarks.support.models import binary_infer_body, mlp_onnx, mlp_weights, start_server, write_model
from benchmarks.support.reporting import Table, print_table, write_results
from benchmarks.support.trials import median, median_load

WIDTH_IN, WIDTH, LAYERS, MAX_BATCH = 1024, 2048, 4, 32
CONFIG = """
backend: "onnxruntime"
max_batch_size: 32
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 1024 ] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ 2048 ] }} ]
{batching}
"""
TARGET_GAIN, TARGET_OF_LIMIT = 3.0, 0.7
# The 32 clients' next requests come back over a few milliseconds after a batch is answered
# (the event loop answers and reads them one by one). A shorter delay sends part of them as a
# batch of their own, which then competes with the event loop for the cores; onnxruntime's
# intra-op threads slow down sharply when one of them loses its core.
QUEUE_DELAY_US = 10_000


@dataclass
class CpuPerRequest:
    """CPU microseconds per request of a server run, by where they were spent."""

    event_loop_us: float
    other_threads_us: float
    load_generator_us: float


def in_process(
    session: ort.InferenceSession, feed: dict[str, np.ndarray], seconds: float
) -> tuple[float, float]:
    """Samples/s of `session.run` on `feed`, and the CPU microseconds it spends per sample."""
    batch = len(feed["x"])
    for _ in range(5):
        session.run(["y"], feed)
    calls = 0
    cpu = time.process_time()
    started = time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        session.run(["y"], feed)
        calls += 1
    return batch * calls / elapsed, (time.process_time() - cpu) * 1e6 / (batch * calls)


def measured_load(
    pid: int, url: str, seconds: float, body: bytes, headers: dict[str, str]
) -> tuple[Load, CpuPerRequest]:
    """One wrk run at concurrency 32, with the CPU time the server's threads and wrk spent."""
    threads, children = thread_cpu_seconds(pid), children_cpu_seconds()
    load = wrk(url, 32, seconds, body, headers)
    after, children_after = thread_cpu_seconds(pid), children_cpu_seconds()
    requests = load.requests_per_s * max(1, round(seconds))
    spent = {tid: used - threads.get(tid, 0.0) for tid, used in after.items()}
    loop = spent.pop(pid, 0.0)  # the main thread runs the event loop
    return load, CpuPerRequest(
        event_loop_us=loop * 1e6 / requests,
        other_threads_us=sum(spent.values()) * 1e6 / requests,
        load_generator_us=(children_after - children) * 1e6 / requests,
    )


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
        CONFIG.format(batching=f"dynamic_batching {{ max_queue_delay_microseconds: {QUEUE_DELAY_US} }}"),
    )

    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    feeds = {batch: {"x": np.ones((batch, WIDTH_IN), np.float32)} for batch in (1, MAX_BATCH)}
    sample = np.random.default_rng(1).normal(size=(1, WIDTH_IN))
    body, headers = binary_infer_body("x", sample, "y")
    server = start_server(repository, "--allow-metrics=false")
    # Rounds interleave the in-process limit with the server rows, so that a neighbour who
    # slows the machine for a while weighs on both sides of each ratio.
    measured: dict[str, list[float]] = {"1": [], str(MAX_BATCH): []}
    in_process_cpu: list[float] = []
    trials: dict[str, list[Load]] = {"mlp": [], "mlp_batched": []}
    cpu: list[CpuPerRequest] = []
    assert server.process is not None
    pid = server.process.pid
    try:
        for name in trials:
            wrk(f"http://{server.http_url}/v2/models/{name}/infer", 32, 2, body, headers)  # warm-up
        for _ in range(args.trials):
            for batch, feed in feeds.items():
                rate, cpu_per_sample = in_process(session, feed, args.seconds / 2)
                measured[str(batch)].append(rate)
                if batch == MAX_BATCH:
                    in_process_cpu.append(cpu_per_sample)
            url = f"http://{server.http_url}/v2/models/mlp/infer"
            trials["mlp"].append(wrk(url, 32, args.seconds, body, headers))
            url = f"http://{server.http_url}/v2/models/mlp_batched/infer"
            load, spent = measured_load(pid, url, args.seconds, body, headers)
            trials["mlp_batched"].append(load)
            cpu.append(spent)
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
    tables: list[Table] = []
    tables.append(
        print_table(
            "MLP [N,1024] -> 4 x 2048 ReLU, HTTP binary, one sample per request (median of trials)",
            ["configuration", "concurrency", "samples/s", "p50 ms", "p99 ms"],
            rows,
        )
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

    # Where (c)'s CPU time goes, and the most the cores could serve if all of it overlapped.
    loop_us = median([c.event_loop_us for c in cpu])
    threads_us = median([c.other_threads_us for c in cpu])
    generator_us = median([c.load_generator_us for c in cpu])
    cores = os.cpu_count() or 1
    total_us = loop_us + threads_us + generator_us
    bound = cores * 1e6 / total_us if total_us else 0.0
    bound_of_limit = bound / limits[MAX_BATCH]
    tables.append(
        print_table(
            "(c) CPU time per request (median of trials)",
            ["where", "CPU us per request"],
            [
                ["server event loop: HTTP, scheduling, responses", loop_us],
                ["server's other threads: onnxruntime", threads_us],
                [f"  (in-process onnxruntime at batch 32, per sample: {median(in_process_cpu):.0f} us)", "-"],
                ["load generator (wrk)", generator_us],
                ["sum", total_us],
            ],
        )
    )
    print(
        f"on {cores} cores that is at most {bound:,.0f} requests/s even if all of it overlapped: "
        f"{bound_of_limit:.2f} x in-process batch 32"
    )
    # With one instance the clients travel as one cohort: the instance computes while the
    # event loop waits, then the loop answers and reads the cohort while the instance waits.
    compute = stats["inference_stats"]["compute_infer"]
    batch_ms = int(compute["ns"]) / max(1, int(compute["count"])) / 1e6
    cycle_ms = batch_ms + average_batch * loop_us / 1000
    cohort = average_batch / cycle_ms * 1000
    print(
        f"one cohort at a time: {batch_ms:.1f} ms computing a batch + {average_batch:.0f} x {loop_us:.0f} us "
        f"in the event loop = {cohort:,.0f} samples/s, {cohort / limits[MAX_BATCH]:.2f} x in-process batch 32"
    )
    path = write_results(
        "batching",
        args,
        tables,
        {
            "in_process_samples_per_s": {str(k): v for k, v in limits.items()},
            "server_without_batching": unbatched,
            "server_with_dynamic_batching": batched,
            "gain": gain,
            "fraction_of_limit": of_limit,
            "fraction_of_limit_by_round": rounds_of_limit,
            "average_batch_size": average_batch,
            "max_queue_delay_microseconds": QUEUE_DELAY_US,
            "cpu_us_per_request": {
                "event_loop": loop_us,
                "other_server_threads": threads_us,
                "load_generator": generator_us,
                "in_process_onnxruntime_per_sample_at_batch_32": median(in_process_cpu),
            },
            "cores": cores,
            "bound_if_all_overlapped_of_limit": bound_of_limit,
            "server_ms_per_batch": batch_ms,
            "one_cohort_at_a_time_of_limit": cohort / limits[MAX_BATCH],
            "targets": {"gain": TARGET_GAIN, "fraction_of_limit": TARGET_OF_LIMIT},
        },
    )
    print(f"results: {path}")


if __name__ == "__main__":
    main()
