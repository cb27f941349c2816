"""What statistics and metrics cost per request.

    python -m benchmarks.features.metrics_cost [--seconds 5] [--trials 3]

Part 1 times, in process, what the scheduler records after each execution of a one-request
batch (ModelStatistics.record_execution) with Triton's defaults (latency counters only), with
the latency summaries on, and with summaries and histograms on; and how long rendering /metrics takes. Part 2 compares
the server's throughput on a tiny model with metrics on and off (HTTP JSON, concurrency 32).
Writes benchmarks/results/metrics_cost.json.
"""

from __future__ import annotations

import argparse
import tempfile
import timeit
from pathlib import Path

import numpy as np

from benchmarks.support.load_generators import wrk
from benchmarks.support.models import start_server, write_model
from benchmarks.support.reporting import Table, print_table, write_results
from benchmarks.support.trials import median_load
from benchmarks.transports.overhead import CONFIG, add_model, json_body
from coreserve.backend import ModelSignature, Responder
from coreserve.config import parse_config
from coreserve.scheduling.statistics import LatencyOptions, ModelStatistics
from coreserve.types import InferenceRequest, now_ns

CALLS = 200_000


def record_cost_ns(latency: LatencyOptions) -> float:
    statistics = ModelStatistics("add", 1, latency)
    config = parse_config('name: "add" ' + CONFIG)
    request = InferenceRequest("add", {"INPUT0": np.ones((1, 4), np.float32)})
    request.queued_ns = now_ns()
    batch = [request]
    responder = Responder(ModelSignature(config), "1", batch)
    responder.mark_inputs_ready()
    responder.mark_infer_done()
    end = now_ns()
    seconds = min(
        timeit.repeat(lambda: statistics.record_execution(batch, responder, end), number=CALLS, repeat=5)
    )
    return seconds / CALLS * 1e9


def scrape_ms(metrics_url: str) -> float:
    """Milliseconds one GET /metrics takes (best of three rounds of 20)."""
    import urllib.request

    def scrape() -> None:
        with urllib.request.urlopen(metrics_url, timeout=10) as response:
            response.read()

    return min(timeit.repeat(scrape, number=20, repeat=3)) / 20 * 1000


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()

    costs = {
        "statistics only (default)": record_cost_ns(LatencyOptions()),
        "+ latency summaries": record_cost_ns(LatencyOptions(summaries=True)),
        "+ summaries and histograms": record_cost_ns(LatencyOptions(summaries=True, histograms=True)),
    }

    repository = Path(tempfile.mkdtemp(prefix="coreserve-metrics-")) / "models"
    write_model(repository, "add", add_model(), CONFIG)
    loads = {}
    render_ms = 0.0
    for label, flags in (("metrics off", ["--allow-metrics=false"]), ("metrics on", [])):
        server = start_server(repository, *flags)
        try:
            url = f"http://{server.http_url}/v2/models/add/infer"
            wrk(url, 32, 2, json_body())
            loads[label] = median_load([wrk(url, 32, args.seconds, json_body()) for _ in range(args.trials)])
            if not flags:
                render_ms = scrape_ms(server.metrics_url)
        finally:
            server.close()

    tables: list[Table] = []
    tables.append(
        print_table(
            "Per-request recording cost (in process, one-request batch)",
            ["what is recorded", "ns per request"],
            [[name, cost] for name, cost in costs.items()],
        )
    )
    tables.append(
        print_table(
            "Server throughput, tiny model, HTTP JSON, concurrency 32 (median of trials)",
            ["configuration", "req/s", "p50 ms", "p99 ms"],
            [[label, load.requests_per_s, load.p50_ms, load.p99_ms] for label, load in loads.items()],
        )
    )
    ratio = loads["metrics on"].requests_per_s / loads["metrics off"].requests_per_s
    per_request_us = costs["statistics only (default)"] / 1000
    print(
        f"\nrecording costs {per_request_us:.2f} us per request with the default metrics; "
        f"throughput with metrics on / off = {ratio:.2f}; one scrape of /metrics takes {render_ms:.2f} ms"
    )
    path = write_results(
        "metrics_cost",
        args,
        tables,
        {
            "record_ns_per_request": costs,
            "throughput": loads,
            "throughput_ratio_on_off": ratio,
            "scrape_ms": render_ms,
        },
    )
    print(f"results: {path}")


if __name__ == "__main__":
    main()
