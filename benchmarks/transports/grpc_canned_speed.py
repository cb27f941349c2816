"""How fast can a Python gRPC server answer at all? Canned answers: native HTTP/2 vs grpc.aio.

    PERF_ANALYZER=/path/to/perf_analyzer python -m benchmarks.transports.grpc_canned_speed [--seconds 3] [--rounds 3]

Issue 16's question before writing an HTTP/2 server of our own: is grpc.aio's per-call code
the ceiling? One coreserve process serves the tiny add model (see overhead.py); its gRPC
answers to the calls perf_analyzer makes (metadata, config, ModelInfer, ModelStreamInfer) are
recorded as bytes, and two servers of grpc_canned_servers.py replay them without decoding
anything: grpc.aio with bytes-in bytes-out generic handlers, and a prototype HTTP/2 server on
an asyncio Protocol. perf_analyzer drives both, unary and `--streaming`, and coreserve's own
HTTP binary path (the whole server, model included) at concurrency 8 and 32, in rounds whose
order rotates. Go on to a native server only if it is clearly faster: >= 1.5x grpc.aio canned.
Writes benchmarks/results/grpc_canned_speed.json.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import grpc

from benchmarks.support.load_generators import Load, perf_analyzer, retrying, run_perf_analyzer
from benchmarks.support.models import start_server, write_model
from benchmarks.support.reporting import Table, print_table, write_results
from benchmarks.support.trials import median, rotated
from benchmarks.transports.grpc_speed import CONCURRENCIES
from benchmarks.transports.overhead import CONFIG, add_model, free_port, grpc_request
from coreserve.protos import grpc_service_pb2 as pb

PATHS = ("native unary", "grpcio unary", "native streaming", "grpcio streaming", "coreserve HTTP binary")


def record_answers(url: str) -> dict[str, str]:
    """The serialized answers of coreserve to the calls perf_analyzer makes, as hex."""
    calls: dict[str, object] = {
        "ServerLive": pb.ServerLiveRequest(),
        "ServerReady": pb.ServerReadyRequest(),
        "ServerMetadata": pb.ServerMetadataRequest(),
        "ModelReady": pb.ModelReadyRequest(name="add"),
        "ModelMetadata": pb.ModelMetadataRequest(name="add"),
        "ModelConfig": pb.ModelConfigRequest(name="add"),
        "ModelInfer": grpc_request(),
        # after an inference: perf_analyzer looks for the version's entry
        "ModelStatistics": pb.ModelStatisticsRequest(name="add"),
    }
    answers = {}
    with grpc.insecure_channel(url) as channel:
        for name, request in calls.items():
            call = channel.unary_unary(f"/inference.GRPCInferenceService/{name}")
            answers[name] = call(request.SerializeToString(), timeout=30).hex()  # type: ignore[attr-defined]
        stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        (answer,) = list(stream(iter([grpc_request().SerializeToString()]), timeout=30))  # type: ignore[attr-defined]
        answers["ModelStreamInfer"] = answer.hex()
    return answers


def start_canned(kind: str, canned: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).with_name("grpc_canned_servers.py")),
            kind,
            str(port),
            str(canned),
        ]
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process, f"127.0.0.1:{port}"
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit(f"the {kind} canned server did not start")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="perf_analyzer measurement window")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of alternating trials")
    args = parser.parse_args()
    analyzer = perf_analyzer()
    if analyzer is None:
        raise SystemExit("perf_analyzer is not installed: set $PERF_ANALYZER (see docs/benchmarks.md)")

    folder = Path(tempfile.mkdtemp(prefix="coreserve-grpc-canned-"))
    write_model(folder / "models", "add", add_model(), CONFIG)
    server = start_server(folder / "models")
    canned = folder / "canned.json"
    canned.write_text(json.dumps(record_answers(server.grpc_url)))
    native, native_url = start_canned("native", canned)
    grpcio, grpcio_url = start_canned("grpcio", canned)

    # "-x 1": canned statistics never change, and perf_analyzer looks for the version whose
    # counts rose unless told which version to read.
    def run(url: str, protocol: str, concurrency: int, *extra: str) -> Load:
        return run_perf_analyzer(
            analyzer, "add", protocol, url, concurrency, args.seconds, extra=["-x", "1", *extra]
        )

    drive: dict[str, Callable[[int], Load]] = {
        "native unary": partial(run, native_url, "grpc"),
        "grpcio unary": partial(run, grpcio_url, "grpc"),
        "native streaming": lambda c: run(native_url, "grpc", c, "--streaming"),
        "grpcio streaming": lambda c: run(grpcio_url, "grpc", c, "--streaming"),
        "coreserve HTTP binary": partial(run, server.http_url, "http"),
    }
    rates: dict[str, dict[int, list[float]]] = {path: {c: [] for c in CONCURRENCIES} for path in PATHS}
    try:
        for round_index in range(args.rounds):
            for concurrency in CONCURRENCIES:
                order = rotated(PATHS, round_index)
                for path in order:
                    load = retrying(partial(drive[path], concurrency))
                    rates[path][concurrency].append(load.requests_per_s)
                    print(
                        f"round {round_index + 1} c={concurrency} {path}: {load.requests_per_s:,.0f}/s",
                        flush=True,
                    )
    finally:
        for process in (native, grpcio):
            process.terminate()
            process.wait(timeout=30)
        server.close()

    rows = []
    for path in PATHS:
        for concurrency in CONCURRENCIES:
            values = rates[path][concurrency]
            base = "grpcio " + path.split()[1] if path.startswith("native") else "coreserve HTTP binary"
            per_round = [ours / other for ours, other in zip(values, rates[base][concurrency], strict=True)]
            rows.append(
                [
                    path,
                    concurrency,
                    median(values),
                    f"{min(values):,.0f}-{max(values):,.0f}",
                    f"{median(per_round):.2f} x {base}" if base != path else "",
                ]
            )
    tables: list[Table] = []
    tables.append(
        print_table(
            f"Canned answers, perf_analyzer, median of {args.rounds} alternating rounds",
            ["path", "concurrency", "req/s", "range", "ratio (median of rounds)"],
            rows,
        )
    )
    write_results("grpc_canned_speed", args, tables, {"rates": rates})


if __name__ == "__main__":
    main()
