"""What shadow traffic costs the client: its latency with every request also copied to a
candidate version, against no copy.

    python -m benchmarks.features.shadow_cost [--model add|mlp] [--seconds 5] [--rounds 4]
                                              [--concurrency 1 4 16] [--load-generator wrk]
                                              [--workers 1]

One server serves a model as versions 1 and 2 (the same model, so every comparison finds no
difference): the tiny add model of overhead.py (HTTP JSON), where a copy costs the server as much
as the request, or the 512x1024x3 MLP of backends.py (HTTP binary), whose compute dominates. Each
round measures each concurrency twice, with the weights {1: 100} alone and with a 100% shadow to
version 2, in alternating order, so that a neighbour who slows the shared machine weighs on both.
`--workers N` serves with N frontend workers (`--http-thread-count`), and `--intra-op-threads N`
bounds each MLP version's ONNX Runtime threads: on a machine of many cores, the candidate's copies
then find cores of their own (ONNX Runtime's default takes every core for each version).
wrk drives it (or perf_analyzer, with random data, where wrk is not installed: the GPU machine's
CPUs, where `benchmarks/gpu/device-run.sh --module benchmarks.features.shadow_cost ...` runs it).
Each figure is the median of its rounds; each ratio (shadow / none) is the median of the per-round
ratios. Writes benchmarks/results/shadow_cost.json (shadow_cost_mlp.json).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import urllib.request
from pathlib import Path

import numpy as np

from benchmarks.backends.backends import LAYERS, MAX_BATCH, WIDTH, WIDTH_IN
from benchmarks.support.load_generators import Load, perf_analyzer, run_perf_analyzer, wrk
from benchmarks.support.models import binary_infer_body, mlp_onnx, mlp_weights, start_server, write_model
from benchmarks.support.reporting import Table, print_table, write_results
from benchmarks.support.trials import median, median_load
from benchmarks.transports.overhead import CONFIG, add_model, free_port, json_body

MODEL = "twin"  # one model, two versions
POLICIES: dict[str, dict[str, object]] = {
    "no shadow": {"weights": {"1": 100}},
    "100% shadow": {"weights": {"1": 100}, "shadow": {"version": "2", "share": 100}},
}
DESCRIBED = {"add": "tiny add model, HTTP JSON", "mlp": "512x1024x3 MLP, HTTP binary"}
MLP_CONFIG = f"""
backend: "onnxruntime"
max_batch_size: {MAX_BATCH}
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ {WIDTH_IN} ] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ {WIDTH} ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""


def _write_model(repository: Path, kind: str, intra_op_threads: int | None) -> tuple[bytes, dict[str, str]]:
    """The model as versions 1 and 2 of MODEL; returns a request's body and headers."""
    headers: dict[str, str] = {}
    if kind == "add":
        model, config, body = add_model(), CONFIG, json_body()
    else:
        model, config = mlp_onnx(mlp_weights(WIDTH_IN, WIDTH, LAYERS)), MLP_CONFIG
        if intra_op_threads is not None:  # each version's share of the cores
            config += f'parameters {{ key: "intra_op_thread_count" value {{ string_value: "{intra_op_threads}" }} }}\n'
        array = np.random.default_rng(0).random((1, WIDTH_IN), np.float32)
        body, headers = binary_infer_body("x", array, "y")
    write_model(repository, MODEL, model, config + "version_policy: { all { } }\n")
    (repository / MODEL / "2").mkdir()
    (repository / MODEL / "2" / "model.onnx").write_bytes(model)
    return body, headers


def _set_policy(http_url: str, policy: dict[str, object]) -> None:
    url = f"http://{http_url}/v2/repository/models/{MODEL}/traffic"
    request = urllib.request.Request(url, data=json.dumps(policy).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=30) as answer:
        answer.read()


def _shadow_outcomes(metrics_url: str) -> dict[str, float]:
    with urllib.request.urlopen(metrics_url, timeout=30) as answer:
        text = answer.read().decode()
    outcomes = {}
    for line in text.splitlines():
        if line.startswith("coreserve_traffic_shadow_requests_total{"):
            outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
            outcomes[outcome] = float(line.rsplit(" ", 1)[1])
    return outcomes


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", choices=tuple(DESCRIBED), default="add")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--load-generator", choices=("wrk", "perf_analyzer"), default="wrk")
    parser.add_argument("--workers", type=int, default=1, help="--http-thread-count (and gRPC's)")
    parser.add_argument("--intra-op-threads", type=int, default=None, help="the MLP's, per version")
    args = parser.parse_args()

    repository = Path(tempfile.mkdtemp(prefix="coreserve-shadow-")) / "models"
    body, headers = _write_model(repository, args.model, args.intra_op_threads)
    workers = [] if args.workers == 1 else [
        f"--http-thread-count={args.workers}", f"--grpc-infer-thread-count={args.workers}",
        f"--http-port={free_port()}", f"--grpc-port={free_port()}", f"--metrics-port={free_port()}",
    ]  # fmt: skip
    server = start_server(repository, *workers)
    loads: dict[tuple[str, int], list[Load]] = {}
    try:
        url = f"http://{server.http_url}/v2/models/{MODEL}/infer"
        binary = perf_analyzer() if args.load_generator == "perf_analyzer" else None
        if args.load_generator == "perf_analyzer" and binary is None:
            raise SystemExit("perf_analyzer not found: set $PERF_ANALYZER")

        def drive(concurrency: int, seconds: float) -> Load:
            if binary is not None:
                return run_perf_analyzer(binary, MODEL, "http", server.http_url, concurrency, seconds)
            return wrk(url, concurrency, seconds, body, headers)

        drive(max(args.concurrency), 2)  # warm-up
        for round_index in range(args.rounds):
            order = list(POLICIES) if round_index % 2 == 0 else list(reversed(POLICIES))
            for concurrency in args.concurrency:
                for label in order:
                    _set_policy(server.http_url, POLICIES[label])
                    loads.setdefault((label, concurrency), []).append(drive(concurrency, args.seconds))
        outcomes = _shadow_outcomes(server.metrics_url)
    finally:
        server.close()

    rows = []
    ratios: dict[str, dict[str, float]] = {}
    for concurrency in args.concurrency:
        pairs = list(zip(loads["no shadow", concurrency], loads["100% shadow", concurrency], strict=True))
        ratios[str(concurrency)] = {
            "p50": median([shadowed.p50_ms / plain.p50_ms for plain, shadowed in pairs]),
            "p99": median([shadowed.p99_ms / plain.p99_ms for plain, shadowed in pairs]),
            "requests_per_s": median(
                [shadowed.requests_per_s / plain.requests_per_s for plain, shadowed in pairs]
            ),
        }
        for label in POLICIES:
            load = median_load(loads[label, concurrency])
            rows.append([concurrency, label, load.requests_per_s, load.p50_ms, load.p99_ms])
    tables: list[Table] = [
        print_table(
            f"The client's answers with and without a 100% shadow copy ({DESCRIBED[args.model]}, medians)",
            ["concurrency", "policy", "req/s", "p50 ms", "p99 ms"],
            rows,
        ),
        print_table(
            "Shadow / no shadow (median of the per-round ratios)",
            ["concurrency", "p50", "p99", "req/s"],
            [[c, r["p50"], r["p99"], r["requests_per_s"]] for c, r in ratios.items()],
        ),
        print_table(
            "The shadow copies (all rounds)",
            ["outcome", "copies"],
            [[k, v] for k, v in sorted(outcomes.items())],
        ),
    ]
    path = write_results(
        "shadow_cost",
        args,
        tables,
        {"loads": {f"{label} @ {c}": median_load(v) for (label, c), v in loads.items()}, "ratios": ratios},
        name="shadow_cost" if args.model == "add" else f"shadow_cost_{args.model}",
    )
    print(f"results: {path}")


if __name__ == "__main__":
    main()
