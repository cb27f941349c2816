"""What Ray Serve's replicas gain, and what its proxy hop costs, for the MLP model.

    python -m benchmarks.backends.ray_serve [--seconds 8] [--trials 2]

The MLP of benchmarks/batching/batching.py (FP32 [N, 1024] through four 2048-wide dense layers, with
dynamic batching), one sample per request, HTTP binary, wrk at concurrency 32, against:
(a) coreserve's own HTTP frontend; (b) Ray Serve's proxy in front of one replica;
(c) the proxy in front of two replicas. The Ray cluster is the tests' two-node local
cluster (tests/support/servers/ray_cluster.py): both nodes share this machine's cores, so (c)
against (b) shows what a second replica costs or gains here, not on two machines.
Each figure is the median of its trials. Needs core-server[ray] and wrk.
Writes benchmarks/results/ray_serve.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Generator
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path[1:1] = [str(REPO / "tests")]
from benchmarks.batching.batching import CONFIG, LAYERS, QUEUE_DELAY_US, WIDTH, WIDTH_IN  # noqa: E402
from benchmarks.support.load_generators import Load, wrk  # noqa: E402
from benchmarks.support.models import binary_infer_body, mlp_onnx, mlp_weights, start_server, write_model  # noqa: E402
from benchmarks.support.reporting import Table, print_table, write_results  # noqa: E402
from benchmarks.support.trials import median_load  # noqa: E402
from support.servers.ray_cluster import Deployment, run_cluster  # noqa: E402

CONCURRENCY = 32


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--trials", type=int, default=2)
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="coreserve-ray-bench-"))
    repository = folder / "models"
    batching = f"dynamic_batching {{ max_queue_delay_microseconds: {QUEUE_DELAY_US} }}"
    write_model(
        repository, "mlp", mlp_onnx(mlp_weights(WIDTH_IN, WIDTH, LAYERS)), CONFIG.format(batching=batching)
    )
    body, headers = binary_infer_body("x", np.random.default_rng(1).normal(size=(1, WIDTH_IN)), "y")

    def load(host_port: str) -> Load:
        url = f"http://{host_port}/v2/models/mlp/infer"
        wrk(url, CONCURRENCY, 2, body, headers)  # warm-up
        return median_load([wrk(url, CONCURRENCY, args.seconds, body, headers) for _ in range(args.trials)])

    loads: dict[str, Load] = {}
    server = start_server(repository, "--allow-metrics=false", "--allow-grpc=false")
    try:
        loads["(a) coreserve HTTP frontend"] = load(server.http_url)
    finally:
        server.close()
    cluster_runner = run_cluster()
    assert isinstance(cluster_runner, Generator)  # a generator function's: close() stops the cluster
    cluster = next(cluster_runner)
    try:
        for replicas in (1, 2):
            deployment = Deployment(
                cluster, str(repository), f"--num-replicas={replicas}", log=folder / f"ray-{replicas}.log"
            )
            try:
                loads[f"({'b' if replicas == 1 else 'c'}) Ray Serve proxy, {replicas} replica(s)"] = load(
                    cluster.url
                )
            finally:
                deployment.close()
    finally:
        cluster_runner.close()  # stops both nodes

    rows = [[name, CONCURRENCY, x.requests_per_s, x.p50_ms, x.p99_ms, x.errors] for name, x in loads.items()]
    tables: list[Table] = []
    tables.append(
        print_table(
            "MLP [1,1024] -> 4 x 2048 ReLU, dynamic batching, HTTP binary, wrk c=32 (median of trials)",
            ["configuration", "concurrency", "requests/s", "p50 ms", "p99 ms", "errors"],
            rows,
        )
    )
    own, one, two = loads.values()
    ratios = {
        "proxy_hop_throughput_ratio": one.requests_per_s / own.requests_per_s,
        "proxy_hop_added_p50_ms": one.p50_ms - own.p50_ms,
        "two_vs_one_replica_throughput_ratio": two.requests_per_s / one.requests_per_s,
    }
    for name, value in ratios.items():
        print(f"{name}: {value:.2f}")
    print(f"results: {write_results('ray_serve', args, tables, {'loads': loads, **ratios})}")


if __name__ == "__main__":
    main()
