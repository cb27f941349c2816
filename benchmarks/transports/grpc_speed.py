"""gRPC against HTTP binary on the tiny add model, driven by perf_analyzer on both sides.

    PERF_ANALYZER=/path/to/perf_analyzer python -m benchmarks.transports.grpc_speed [--seconds 3] [--rounds 3]

One coreserve process serves the add model (two FP32 [1, 4] inputs, see overhead.py). Each
round runs one perf_analyzer trial of each path at each concurrency (8 and 32): unary
ModelInfer, streaming ModelStreamInfer (`--streaming`) and the HTTP binary path, in an order
that rotates from round to round, so that a neighbour who slows the shared machine for a while
weighs on every side of a ratio. Each figure is the median of its rounds, shown with the
range; each ratio is the median of the per-round ratios. Targets (issue 16): gRPC, unary and
streaming, >= 0.8 x HTTP binary. The same client drives every path, so its own CPU cost is
the same on each side of a ratio.

With `--triton-cmd` (or $TRITON_CMD), e.g. `../shared/tools/real-tritonserver`, the real Triton
serves the same model through a python-backend model.py that runs onnxruntime, and its gRPC
unary and streaming paths join the rounds. Target: coreserve's gRPC >= 1.5 x Triton's.
Writes benchmarks/results/grpc_speed.json.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import tempfile
import time
import urllib.request
from functools import partial
from pathlib import Path

from benchmarks.support.load_generators import perf_analyzer, retrying, run_perf_analyzer
from benchmarks.support.models import start_server, write_model
from benchmarks.support.reporting import Table, print_table, write_results
from benchmarks.support.trials import median, rotated
from benchmarks.transports.overhead import CONFIG, add_model, free_port

CONCURRENCIES = (8, 32)
TARGET_RATIO = 0.8
TRITON_TARGET_RATIO = 1.5
PATHS = ("gRPC unary", "gRPC streaming", "HTTP binary")
TRITON_PATHS = ("Triton gRPC unary", "Triton gRPC streaming")
GRPCIO_PATHS = ("grpcio gRPC unary", "grpcio gRPC streaming")  # --compare-grpcio
# The add model for Triton's python backend: onnxruntime in the stub process.
TRITON_MODEL_PY = """
import os
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])

    def execute(self, requests):
        responses = []
        for request in requests:
            feeds = {name: pb_utils.get_input_tensor_by_name(request, name).as_numpy() for name in ("INPUT0", "INPUT1")}
            (output,) = self.session.run(["OUTPUT0"], feeds)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", output)]))
        return responses
"""


def _start_triton(command: str, repository: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Starts Triton on free ports over a copy of the add model; returns it and its gRPC address."""
    write_model(repository, "add", add_model(), CONFIG.replace('backend: "onnxruntime"', 'backend: "python"'))
    (repository / "add" / "1" / "model.py").write_text(TRITON_MODEL_PY)
    ports = [free_port() for _ in range(3)]
    process = subprocess.Popen(
        [
            *shlex.split(command),
            f"--model-repository={repository}",
            f"--http-port={ports[0]}",
            f"--grpc-port={ports[1]}",
            f"--metrics-port={ports[2]}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ports[0]}/v2/models/add/ready", timeout=2):
                return process, f"127.0.0.1:{ports[1]}"
        except OSError:
            if process.poll() is not None:
                break
            time.sleep(1)
    process.kill()
    raise SystemExit(f"Triton ({command}) did not serve the add model")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="perf_analyzer measurement window")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of alternating trials")
    parser.add_argument(
        "--triton-cmd",
        default=os.environ.get("TRITON_CMD"),
        help="command that starts tritonserver (default $TRITON_CMD; none: no Triton rows)",
    )
    parser.add_argument(
        "--grpc-server",
        choices=("grpcio", "native"),
        default="native",
        help="coreserve's --grpc-server (default native, the server's own default)",
    )
    parser.add_argument(
        "--compare-grpcio",
        action="store_true",
        help="with --grpc-server native: a second coreserve on grpcio joins the rounds",
    )
    args = parser.parse_args()
    analyzer = perf_analyzer()
    if analyzer is None:
        raise SystemExit("perf_analyzer is not installed: set $PERF_ANALYZER (see docs/benchmarks.md)")

    repository = Path(tempfile.mkdtemp(prefix="coreserve-grpc-speed-")) / "models"
    write_model(repository, "add", add_model(), CONFIG)
    server = start_server(repository, f"--grpc-server={args.grpc_server}")
    paths: tuple[str, ...] = PATHS
    triton = None
    triton_url = ""
    if args.triton_cmd:
        triton, triton_url = _start_triton(args.triton_cmd, repository.parent / "triton")
        paths = PATHS + TRITON_PATHS
    baseline = None
    baseline_url = ""
    if args.compare_grpcio and args.grpc_server == "native":
        baseline = start_server(repository, "--grpc-server=grpcio")
        baseline_url = baseline.grpc_url
        paths += GRPCIO_PATHS
    drive = {
        "gRPC unary": lambda c: run_perf_analyzer(analyzer, "add", "grpc", server.grpc_url, c, args.seconds),
        "gRPC streaming": lambda c: run_perf_analyzer(
            analyzer, "add", "grpc", server.grpc_url, c, args.seconds, extra=["--streaming"]
        ),
        "HTTP binary": lambda c: run_perf_analyzer(analyzer, "add", "http", server.http_url, c, args.seconds),
        "grpcio gRPC unary": lambda c: run_perf_analyzer(
            analyzer, "add", "grpc", baseline_url, c, args.seconds
        ),
        "grpcio gRPC streaming": lambda c: run_perf_analyzer(
            analyzer, "add", "grpc", baseline_url, c, args.seconds, extra=["--streaming"]
        ),
        "Triton gRPC unary": lambda c: run_perf_analyzer(
            analyzer, "add", "grpc", triton_url, c, args.seconds
        ),
        "Triton gRPC streaming": lambda c: run_perf_analyzer(
            analyzer, "add", "grpc", triton_url, c, args.seconds, extra=["--streaming"]
        ),
    }
    # rates[path][concurrency]: requests/s of each round, in round order
    rates: dict[str, dict[int, list[float]]] = {path: {c: [] for c in CONCURRENCIES} for path in paths}
    try:
        for round_index in range(args.rounds):
            for concurrency in CONCURRENCIES:
                order = rotated(paths, round_index)
                for path in order:
                    load = retrying(partial(drive[path], concurrency))
                    rates[path][concurrency].append(load.requests_per_s)
                    print(
                        f"round {round_index + 1} c={concurrency} {path}: {load.requests_per_s:,.0f}/s",
                        flush=True,
                    )
    finally:
        server.close()
        if baseline is not None:
            baseline.close()
        if triton is not None:
            triton.terminate()
            triton.wait(timeout=60)

    rows = []
    ratios: dict[str, dict[int, list[float]]] = {}
    for path in paths:
        for concurrency in CONCURRENCIES:
            values = rates[path][concurrency]
            http = rates["HTTP binary"][concurrency]
            per_round = [ours / base for ours, base in zip(values, http, strict=True)]
            ratios.setdefault(path, {})[concurrency] = per_round
            rows.append(
                [
                    path if path.startswith("Triton") else f"coreserve {path}",
                    concurrency,
                    median(values),
                    f"{min(values):,.0f}-{max(values):,.0f}",
                    f"{median(per_round):.2f} ({min(per_round):.2f}-{max(per_round):.2f})",
                ]
            )
    tables: list[Table] = []
    tables.append(
        print_table(
            f"Tiny add model, perf_analyzer, median of {args.rounds} alternating rounds",
            ["path", "concurrency", "req/s", "range", "x HTTP binary (range)"],
            rows,
        )
    )
    for path in ("gRPC unary", "gRPC streaming"):
        for concurrency in CONCURRENCIES:
            ratio = median(ratios[path][concurrency])
            verdict = "meets" if ratio >= TARGET_RATIO else "MISSES"
            print(
                f"{path} / HTTP binary at concurrency {concurrency}: {ratio:.2f} ({verdict} the {TARGET_RATIO} target)"
            )
    against_triton: dict[str, dict[str, list[float]]] = {}
    if triton is not None:
        for path in ("gRPC unary", "gRPC streaming"):
            for concurrency in CONCURRENCIES:
                theirs = rates[f"Triton {path}"][concurrency]
                per_round = [o / t for o, t in zip(rates[path][concurrency], theirs, strict=True)]
                against_triton.setdefault(path, {})[str(concurrency)] = per_round
                ratio = median(per_round)
                verdict = "meets" if ratio >= TRITON_TARGET_RATIO else "MISSES"
                print(
                    f"coreserve {path} / Triton's at concurrency {concurrency}: {ratio:.2f} "
                    f"({min(per_round):.2f}-{max(per_round):.2f}; {verdict} the {TRITON_TARGET_RATIO} target)"
                )
    results = write_results(
        "grpc_speed",
        args,
        tables,
        {
            "requests_per_s_by_round": {p: {str(c): v for c, v in by_c.items()} for p, by_c in rates.items()},
            "ratio_to_http_binary_by_round": {
                p: {str(c): v for c, v in by_c.items()} for p, by_c in ratios.items()
            },
            "target_ratio": TARGET_RATIO,
            "ratio_to_triton_by_round": against_triton,
            "triton_target_ratio": TRITON_TARGET_RATIO,
        },
    )
    print(f"results: {results}")


if __name__ == "__main__":
    main()
