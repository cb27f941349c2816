"""What tracing costs: server throughput with tracing off, at rate 1/1000 and at rate 1.

    python -m benchmarks.features.trace_cost [--seconds 5] [--trials 3]

A tiny model (two FP32 [1, 4] inputs added) over HTTP JSON at concurrency 32, driven by wrk,
so nearly all the time is the server's own. "off" is Triton's default (level OFF): the request
path checks one attribute. The traced rows write Triton's JSON trace file (mode=triton,
TIMESTAMPS) into a temporary folder; at rate 1 every request is traced. The configurations
take turns within each trial, so that a noisy neighbour slows them alike; each row is the
median of the trials. Writes benchmarks/results/trace_cost.json.
"""

from __future__ import annotations

import argparse
import tempfile
import timeit
from pathlib import Path

import numpy as np

from benchmarks.support.load_generators import Load, wrk
from benchmarks.support.models import start_server, write_model
from benchmarks.support.reporting import Table, print_table, write_results
from benchmarks.support.trials import median_load
from benchmarks.transports.overhead import CONFIG, add_model, json_body
from coreserve.tracing import Tracer
from coreserve.types import InferenceRequest

CALLS = 1_000_000


def off_checks_ns() -> float:
    """Nanoseconds per request of the checks tracing off leaves on the request path.

    The same statements as the path makes them: the frontend's and the data plane's look at
    `tracer.active`, and the None checks of `request.trace` after execution, at the answer
    and at the send; the loop's own cost (an empty body) is subtracted.
    """
    tracer = Tracer()
    request = InferenceRequest("add", {"INPUT0": np.ones((1, 4), np.float32)})

    def checks() -> None:
        if tracer.active:
            raise AssertionError
        if tracer.active:
            raise AssertionError
        if request.trace is not None:
            raise AssertionError
        if request.trace is not None:
            raise AssertionError
        if request.trace is not None:
            raise AssertionError

    def nothing() -> None:
        return None

    timed = min(timeit.repeat(checks, number=CALLS, repeat=5))
    empty = min(timeit.repeat(nothing, number=CALLS, repeat=5))
    return (timed - empty) / CALLS * 1e9


def configurations(folder: Path) -> dict[str, list[str]]:
    traced = [
        "--trace-config=level=TIMESTAMPS",
        f"--trace-config=triton,file={folder / 'trace.json'}",
        "--trace-config=triton,log-frequency=1000",  # written as it goes, not held to the end
    ]
    return {
        "tracing off (default)": [],
        "rate 1/1000": [*traced, "--trace-config=rate=1000"],
        "rate 1 (every request)": [*traced, "--trace-config=rate=1"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()

    checks_ns = off_checks_ns()
    folder = Path(tempfile.mkdtemp(prefix="coreserve-trace-cost-"))
    repository = folder / "models"
    write_model(repository, "add", add_model(), CONFIG)
    runs: dict[str, list[Load]] = {label: [] for label in configurations(folder)}
    for _ in range(args.trials):
        for label, flags in configurations(folder).items():
            server = start_server(repository, *flags)
            try:
                url = f"http://{server.http_url}/v2/models/add/infer"
                wrk(url, 32, 1, json_body())  # warm-up
                runs[label].append(wrk(url, 32, args.seconds, json_body()))
            finally:
                server.close()
    loads = {label: median_load(trials) for label, trials in runs.items()}
    off = loads["tracing off (default)"].requests_per_s
    tables: list[Table] = []
    tables.append(
        print_table(
            "Server throughput with tracing, tiny model, HTTP JSON, concurrency 32 (median of trials)",
            ["configuration", "req/s", "vs off", "p50 ms", "p99 ms"],
            [
                [label, load.requests_per_s, load.requests_per_s / off, load.p50_ms, load.p99_ms]
                for label, load in loads.items()
            ],
        )
    )
    print(f"\ntracing off: the request path's checks cost {checks_ns:.0f} ns per request (in process)")
    results = {
        "throughput": loads,
        "off_checks_ns": checks_ns,
        "seconds": args.seconds,
        "trials": args.trials,
    }
    path = write_results("trace_cost", args, tables, results)
    print(f"results: {path}")


if __name__ == "__main__":
    main()
