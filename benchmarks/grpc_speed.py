"""gRPC against HTTP binary on the tiny add model, driven by perf_analyzer on both sides.

    PERF_ANALYZER=/path/to/perf_analyzer python benchmarks/grpc_speed.py [--seconds 3] [--rounds 3]

One coreserve process serves the add model (two FP32 [1, 4] inputs, see overhead.py). Each
round runs one perf_analyzer trial of each path at each concurrency (8 and 32): unary
ModelInfer, streaming ModelStreamInfer (`--streaming`) and the HTTP binary path, in an order
that rotates from round to round, so that a neighbour who slows the shared machine for a while
weighs on every side of a ratio. Each figure is the median of its rounds, shown with the
range; each ratio is the median of the per-round ratios. Targets (issue 16): gRPC, unary and
streaming, >= 0.8 x HTTP binary. The same client drives every path, so its own CPU cost is
the same on each side of a ratio.
Writes benchmarks/results/grpc_speed.json.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    Load,
    median,
    perf_analyzer,
    print_table,
    run_perf_analyzer,
    start_server,
    write_model,
    write_results,
)
from overhead import CONFIG, add_model

CONCURRENCIES = (8, 32)
TARGET_RATIO = 0.8
PATHS = ("gRPC unary", "gRPC streaming", "HTTP binary")


def _retrying(measure: Callable[[], Load], attempts: int = 3) -> Load:
    """perf_analyzer gives up when its windows differ too much (a neighbour's burst): try again."""
    for attempt in range(attempts):
        try:
            return measure()
        except subprocess.CalledProcessError as exc:
            print(f"perf_analyzer failed (attempt {attempt + 1}): {exc.stdout[-300:]}", flush=True)
    raise SystemExit("perf_analyzer failed every attempt")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="perf_analyzer measurement window")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of alternating trials")
    args = parser.parse_args()
    analyzer = perf_analyzer()
    if analyzer is None:
        raise SystemExit("perf_analyzer is not installed: set $PERF_ANALYZER (see README, Benchmarks)")

    repository = Path(tempfile.mkdtemp(prefix="coreserve-grpc-speed-")) / "models"
    write_model(repository, "add", add_model(), CONFIG)
    server = start_server(repository)
    drive = {
        "gRPC unary": lambda c: run_perf_analyzer(analyzer, "add", "grpc", server.grpc_url, c, args.seconds),
        "gRPC streaming": lambda c: run_perf_analyzer(
            analyzer, "add", "grpc", server.grpc_url, c, args.seconds, extra=["--streaming"]
        ),
        "HTTP binary": lambda c: run_perf_analyzer(analyzer, "add", "http", server.http_url, c, args.seconds),
    }
    # rates[path][concurrency]: requests/s of each round, in round order
    rates: dict[str, dict[int, list[float]]] = {path: {c: [] for c in CONCURRENCIES} for path in PATHS}
    try:
        for round_index in range(args.rounds):
            for concurrency in CONCURRENCIES:
                order = PATHS[round_index % len(PATHS) :] + PATHS[: round_index % len(PATHS)]
                for path in order:
                    load = _retrying(partial(drive[path], concurrency))
                    rates[path][concurrency].append(load.requests_per_s)
                    print(
                        f"round {round_index + 1} c={concurrency} {path}: {load.requests_per_s:,.0f}/s",
                        flush=True,
                    )
    finally:
        server.close()

    rows = []
    ratios: dict[str, dict[int, list[float]]] = {}
    for path in PATHS:
        for concurrency in CONCURRENCIES:
            values = rates[path][concurrency]
            http = rates["HTTP binary"][concurrency]
            per_round = [ours / base for ours, base in zip(values, http, strict=True)]
            ratios.setdefault(path, {})[concurrency] = per_round
            rows.append(
                [
                    f"coreserve {path}",
                    concurrency,
                    median(values),
                    f"{min(values):,.0f}-{max(values):,.0f}",
                    f"{median(per_round):.2f} ({min(per_round):.2f}-{max(per_round):.2f})",
                ]
            )
    print_table(
        f"Tiny add model, perf_analyzer, median of {args.rounds} alternating rounds",
        ["path", "concurrency", "req/s", "range", "x HTTP binary (range)"],
        rows,
    )
    for path in ("gRPC unary", "gRPC streaming"):
        for concurrency in CONCURRENCIES:
            ratio = median(ratios[path][concurrency])
            verdict = "meets" if ratio >= TARGET_RATIO else "MISSES"
            print(
                f"{path} / HTTP binary at concurrency {concurrency}: {ratio:.2f} ({verdict} the {TARGET_RATIO} target)"
            )
    results = write_results(
        "grpc_speed",
        {
            "requests_per_s_by_round": {p: {str(c): v for c, v in by_c.items()} for p, by_c in rates.items()},
            "ratio_to_http_binary_by_round": {
                p: {str(c): v for c, v in by_c.items()} for p, by_c in ratios.items()
            },
            "target_ratio": TARGET_RATIO,
        },
    )
    print(f"results: {results}")


if __name__ == "__main__":
    main()
