"""What the response cache gains on hits and costs on misses: the tiny add model over HTTP JSON.

    python -m benchmarks.features.response_cache [--seconds 5] [--trials 3] [--concurrency 32]

One server (`--cache-config local,size=1048576`, or `--cache-size`) serves the add model of overhead.py twice:
`add` without `response_cache` and `add_cached` with it. wrk (one thread) drives each in turn,
trial by trial, so that a neighbour slowing the machine weighs on both sides of each ratio:

- 100% hits: the same body every time, to `add_cached` vs `add` (the cache off). Hits must be
  faster: a hit skips the queue, the instance's thread and onnxruntime.
- 0% hits: every body different (response_cache_unique.lua), to `add_cached` vs `add`. Each
  request is a miss (hash, lookup, copy and insert, and after the first MiB an LRU eviction);
  the target is a cost of at most 5% of the throughput.

Each row is the median of the trials. Writes benchmarks/results/response_cache.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

from benchmarks.support.cpu_time import cpu_seconds
from benchmarks.support.load_generators import Load, wrk, wrk_load
from benchmarks.support.models import start_server, write_model
from benchmarks.support.reporting import Table, print_table, write_results
from benchmarks.support.trials import median, median_load
from benchmarks.transports.overhead import CONFIG, add_model, json_body

UNIQUE_SCRIPT = Path(__file__).with_name("response_cache_unique.lua")
CACHE_SIZE = 1024 * 1024
MAX_MISS_COST = 0.05


_RUNS = [0]


def wrk_unique(url: str, concurrency: int, seconds: float) -> Load:
    """wrk with a different body for every request (no two share a cache key, across runs too)."""
    _RUNS[0] += 1
    completed = subprocess.run(
        ["wrk", "-t1", f"-c{concurrency}", f"-d{max(1, round(seconds))}s", "--timeout", "10s", "-s",
         str(UNIQUE_SCRIPT), url],
        capture_output=True, text=True, env={**os.environ, "WRK_RUN_ID": str(_RUNS[0])}, check=True,
        timeout=seconds + 60,
    )  # fmt: skip
    return wrk_load(completed)


def measured(pid: int, run: Callable[[], Load]) -> tuple[Load, float]:
    """A load and the server's CPU microseconds per request under it: a figure that neighbours
    slowing the machine change far less than they change throughput."""
    before = cpu_seconds(pid)
    load = run()
    used = cpu_seconds(pid) - before
    requests = load.requests_per_s * max(1, round(SECONDS[0]))
    return load, used / requests * 1e6


SECONDS = [5.0]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="length of one trial")
    parser.add_argument("--trials", type=int, default=3, help="trials per row (the median is reported)")
    parser.add_argument("--concurrency", type=int, default=32, help="wrk connections")
    parser.add_argument(
        "--cache-size", type=int, default=CACHE_SIZE, help="--cache-config local,size (bytes)"
    )
    args = parser.parse_args()
    SECONDS[0] = args.seconds

    repository = Path(tempfile.mkdtemp(prefix="coreserve-cache-bench-")) / "models"
    model = add_model()
    write_model(repository, "add", model, CONFIG)
    write_model(repository, "add_cached", model, CONFIG + "response_cache { enable: true }\n")
    server = start_server(repository, f"--cache-config=local,size={args.cache_size}")
    base = f"http://{server.http_url}/v2/models"
    body = json_body()
    hits: list[tuple[tuple[Load, float], tuple[Load, float]]] = []
    misses: list[tuple[tuple[Load, float], tuple[Load, float]]] = []
    assert server.process is not None
    pid = server.process.pid
    try:
        # Warm both paths (the instances' threads, the cache's first entry) before measuring.
        wrk(f"{base}/add/infer", args.concurrency, 1, body)
        wrk(f"{base}/add_cached/infer", args.concurrency, 1, body)
        for trial in range(args.trials):
            # Which side runs first alternates too: a side that always ran second would always
            # meet the machine in the state the first left it.
            order = ("add", "add_cached") if trial % 2 == 0 else ("add_cached", "add")
            hit_runs = {
                m: measured(pid, partial(wrk, f"{base}/{m}/infer", args.concurrency, args.seconds, body))
                for m in order
            }
            miss_runs = {
                m: measured(pid, partial(wrk_unique, f"{base}/{m}/infer", args.concurrency, args.seconds))
                for m in order
            }
            hits.append((hit_runs["add"], hit_runs["add_cached"]))
            misses.append((miss_runs["add"], miss_runs["add_cached"]))
        statistics = json.loads(
            subprocess.run(
                ["curl", "-s", f"{base}/add_cached/stats"], capture_output=True, text=True, check=True
            ).stdout
        )["model_stats"][0]["inference_stats"]
    finally:
        server.close()

    errors = sum(load.errors for pair in hits + misses for load, _ in pair)
    hit_ratio = median([cached.requests_per_s / off.requests_per_s for (off, _), (cached, _) in hits])
    miss_ratio = median([cached.requests_per_s / off.requests_per_s for (off, _), (cached, _) in misses])
    hit_cpu = median([cached / off for (_, off), (_, cached) in hits])
    miss_cpu = median([cached / off for (_, off), (_, cached) in misses])
    rows = []
    for label, pairs in (("same body (100% hits)", hits), ("every body new (0% hits)", misses)):
        for side, index in (("cache off", 0), ("response_cache", 1)):
            load = median_load([pair[index][0] for pair in pairs])
            cpu = median([pair[index][1] for pair in pairs])
            rows.append([f"{label}, {side}", load.requests_per_s, load.p50_ms, load.p99_ms, cpu])
    tables: list[Table] = []
    tables.append(
        print_table(
            f"Tiny add model over HTTP JSON, wrk 1 thread x {args.concurrency} connections (median of "
            f"{args.trials} alternating trials)",
            ["load", "req/s", "p50 ms", "p99 ms", "server CPU us/request"],
            rows,
        )
    )
    hit_verdict = "faster" if hit_ratio > 1 else "NOT FASTER"
    miss_cost = 1 - miss_ratio
    miss_verdict = "meets" if miss_cost <= MAX_MISS_COST else "MISSES"
    print(
        f"\n100% hits / cache off: throughput {hit_ratio:.2f} ({hit_verdict}); server CPU per request {hit_cpu:.2f}"
    )
    print(f"0% hits / cache off: throughput {miss_ratio:.3f}: a miss costs {miss_cost:.1%} ({miss_verdict} the "
          f"<= 5% target); server CPU per request {miss_cpu:.3f}")  # fmt: skip
    print(f"add_cached: {statistics['cache_hit']['count']} hits, {statistics['cache_miss']['count']} misses; "
          f"wrk errors: {errors}")  # fmt: skip
    path = write_results(
        "response_cache",
        args,
        tables,
        {
            "concurrency": args.concurrency,
            "seconds": args.seconds,
            "trials": args.trials,
            "cache_size": args.cache_size,
            "hits": [[{**load.__dict__, "cpu_us": cpu} for load, cpu in pair] for pair in hits],
            "misses": [[{**load.__dict__, "cpu_us": cpu} for load, cpu in pair] for pair in misses],
            "hit_cpu_ratio": hit_cpu,
            "miss_cpu_ratio": miss_cpu,
            "hit_ratio": hit_ratio,
            "miss_ratio": miss_ratio,
            "miss_cost": miss_cost,
            "hits_faster": hit_ratio > 1,
            "miss_cost_within_target": miss_cost <= MAX_MISS_COST,
            "wrk_errors": errors,
        },
    )
    print(f"results: {path}")


if __name__ == "__main__":
    main()
