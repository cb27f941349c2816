"""This tree's coreserve against a base commit's, the same load on both, in alternating rounds.

    python -m benchmarks.transports.ab_servers --base REF [--seconds 3] [--rounds 4] [--concurrency 1 8 32]
                                    [--paths http-json http-binary grpc python-json]

Checks that a change costs nothing where it should cost nothing. The base commit is checked out
in a temporary git worktree; each side runs in its own server process (the base one with its
worktree first on PYTHONPATH), both serving the tiny add model of overhead.py and the add-one
model.py of python_speed.py (path python-json: HTTP JSON to a Python model). Each round
drives every path and concurrency on both servers, the base first in even rounds and second in
odd ones, so that a neighbour who slows the shared machine weighs on both sides. HTTP goes
through wrk (JSON and binary bodies), gRPC through h2load (unary ModelInfer). Each figure is
the median of its rounds; each ratio (this tree / base) is the median of the per-round ratios,
shown with their range. Beside throughput, the server's CPU per request (its process and
children, from /proc), which a neighbour on the machine disturbs less. Writes
benchmarks/results/ab_servers.json.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from benchmarks.python.python_speed import JSON_BODY as PYTHON_JSON_BODY
from benchmarks.python.python_speed import MODEL as PYTHON_MODEL
from benchmarks.python.python_speed import write_repository as write_python_model
from benchmarks.support.cpu_time import tree_cpu_seconds
from benchmarks.support.load_generators import Load, grpc_call_succeeds, h2load_grpc, retrying, wrk
from benchmarks.support.models import write_model
from benchmarks.support.reporting import Table, print_table, write_results
from benchmarks.support.trials import median
from benchmarks.transports.overhead import CONFIG, add_model, binary_body, grpc_request, json_body
from coreserve.testing import ServerProcess

REPO = Path(__file__).resolve().parents[2]
PATHS = ("http-json", "http-binary", "grpc", "python-json")
METHOD = "/inference.GRPCInferenceService/ModelInfer"


def start(repository: Path, source: Path) -> ServerProcess:
    """A server running the coreserve of `source` (a checkout: its core, plugin-onnx and
    plugin-python, whose stubs get the same PYTHONPATH)."""
    path = f"{source / 'core'}:{source / 'plugins' / 'onnx'}:{source / 'plugins' / 'python'}"
    return ServerProcess([repository], ["--log-verbose=0"], env={"PYTHONPATH": path}).start(timeout=120)


def measure(server: ServerProcess, path: str, concurrency: int, seconds: float) -> Load:
    url = f"http://{server.http_url}/v2/models/add/infer"
    if path == "http-json":
        return retrying(lambda: wrk(url, concurrency, seconds, json_body()))
    if path == "python-json":
        python_url = f"http://{server.http_url}/v2/models/{PYTHON_MODEL}/infer"
        return retrying(lambda: wrk(python_url, concurrency, seconds, PYTHON_JSON_BODY))
    if path == "http-binary":
        body, headers = binary_body()
        return retrying(lambda: wrk(url, concurrency, seconds, body, headers))
    message = grpc_request().SerializeToString()  # type: ignore[attr-defined]
    return retrying(lambda: h2load_grpc(server.grpc_url, METHOD, message, concurrency, seconds))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", required=True, help="the commit to compare with (any git revision)")
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each trial")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of alternating trials")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument(
        "--base-tree",
        type=Path,
        help="the base's sources already on disk (where git cannot check it out: a machine the "
        "history did not travel to); --base then only names it",
    )
    args = parser.parse_args()

    with (
        tempfile.TemporaryDirectory() as folder,
        base_checkout(args.base, args.base_tree, folder) as base_tree,
    ):
        repository = Path(folder) / "models"
        write_model(repository, "add", add_model(), CONFIG)
        write_python_model(repository)
        servers = {"base": start(repository, base_tree), "this tree": start(repository, REPO)}
        try:
            for server in servers.values():
                grpc_call_succeeds(server.grpc_url, METHOD, grpc_request().SerializeToString())  # type: ignore[attr-defined]
            results = run_rounds(servers, args)
        finally:
            for server in servers.values():
                server.close()
    if args.base_tree is None:
        named = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", args.base], capture_output=True, text=True
        )
        base = named.stdout.strip()
    else:
        base = args.base
    report(results, args, base)


@contextlib.contextmanager
def base_checkout(base: str, tree: Path | None, folder: str) -> Iterator[Path]:
    """The base's sources: `tree` as given, or a git worktree of `base`, removed afterwards."""
    if tree is not None:
        yield tree.resolve()
        return
    checkout = Path(folder) / "base"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(checkout), base], check=True)
    try:
        yield checkout
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(checkout)], check=True)


# (path, concurrency) -> side -> per-round (requests/s, server CPU µs per request)
Rounds = dict[tuple[str, int], dict[str, list[tuple[float, float]]]]


def run_rounds(servers: dict[str, ServerProcess], args: argparse.Namespace) -> Rounds:
    results: Rounds = {}
    sides: list[tuple[str, ServerProcess]] = list(servers.items())
    for round_index in range(args.rounds):
        ordered = sides if round_index % 2 == 0 else sides[::-1]
        for path in args.paths:
            for concurrency in args.concurrency:
                row = results.setdefault((path, concurrency), {name: [] for name in servers})
                for name, server in ordered:
                    assert server.process is not None
                    before = tree_cpu_seconds(server.process.pid)
                    load = measure(server, path, concurrency, args.seconds)
                    spent = tree_cpu_seconds(server.process.pid) - before
                    served = load.requests_per_s * args.seconds
                    row[name].append((load.requests_per_s, 1e6 * spent / served if served else 0.0))
        print(f"round {round_index + 1} of {args.rounds} done", flush=True)
    return results


def report(results: Rounds, args: argparse.Namespace, base: str) -> None:
    rows = []
    measured: list[dict[str, object]] = []
    for (path, concurrency), sides in results.items():
        old, new = sides["base"], sides["this tree"]
        speed = [n[0] / o[0] for n, o in zip(new, old, strict=True)]
        cpu = [n[1] / o[1] for n, o in zip(new, old, strict=True) if o[1]]
        rows.append(
            (
                path,
                concurrency,
                round(median([rate for rate, _ in old])),
                round(median([rate for rate, _ in new])),
                f"{median(speed):.2f}",
                f"{min(speed):.2f}-{max(speed):.2f}",
                f"{median([used for _, used in old]):.0f}",
                f"{median([used for _, used in new]):.0f}",
                f"{median(cpu):.2f}" if cpu else "-",
            )
        )
        measured.append(
            {"path": path, "concurrency": concurrency, **sides, "speed_ratios": speed, "cpu_ratios": cpu}
        )
    tables: list[Table] = []
    tables.append(
        print_table(
            f"this tree against {base} (median of {args.rounds} rounds of {args.seconds:g} s)",
            [
                "path",
                "concurrency",
                "base req/s",
                "this tree req/s",
                "ratio",
                "rounds",
                "base CPU µs",
                "this tree CPU µs",
                "CPU ratio",
            ],
            rows,
        )
    )
    document = {"base": base, "seconds": args.seconds, "rounds": args.rounds, "rows": measured}
    print(f"wrote {write_results('ab_servers', args, tables, document)}")


if __name__ == "__main__":
    main()
