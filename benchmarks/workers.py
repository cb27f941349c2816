"""One worker against N: the same server with --http-thread-count and --grpc-infer-thread-count
at 1 and at N, in alternating rounds.

    python benchmarks/workers.py [--workers N] [--seconds 4] [--rounds 4] [--concurrency 1 32]
                                 [--paths http-json grpc python-json sequence-json openai-stream]
                                 [--load-threads T]

Both servers run at once on their own ports, serving the tiny add model of overhead.py, the
add-one model.py of python_speed.py and the streaming `charlm` of the OpenAI tests. The
`sequence-json` path sends HTTP JSON to the add model with a sequence batcher, each request a
sequence of its own: under workers only worker 0 serves it, and the others send it their
requests, so this row measures that hop. Each round
drives every path and concurrency on both, one first in even rounds and the other in odd ones,
so that a neighbour who slows the shared machine weighs on both. HTTP JSON goes through wrk,
gRPC through h2load (unary ModelInfer), each with `--load-threads` threads (default: a
quarter of the machine's cores, at least 1); OpenAI streaming through aiohttp clients in this
process (tokens/s: one Python process, so it measures less than the others). Each figure is
the median of its rounds; the ratio (N / 1) is the median of the per-round ratios. Writes
benchmarks/results/workers.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "e2e"))
from load_generators import Load, grpc_call_succeeds, h2load_grpc, retrying, wrk
from models import write_model
from openai_repository import openai_repository, openai_url
from openai_stream import openai_stream_round
from overhead import CONFIG, add_model, free_port, grpc_request, json_body
from python_speed import JSON_BODY as PYTHON_JSON_BODY
from python_speed import MODEL as PYTHON_MODEL
from python_speed import write_repository as write_python_model
from reporting import print_table, write_results
from trials import median

from coreserve.testing import ServerProcess

PATHS = ("http-json", "grpc", "python-json", "sequence-json", "openai-stream")
METHOD = "/inference.GRPCInferenceService/ModelInfer"
MAX_TOKENS = 64


def start(repository: Path, workers: int) -> ServerProcess:
    """A coreserve of `workers` workers on free ports (named: workers share them)."""
    ports = [
        f"--http-port={free_port()}",
        f"--grpc-port={free_port()}",
        f"--openai-port={free_port()}",
        f"--http-thread-count={workers}",
        f"--grpc-infer-thread-count={workers}",
        "--log-verbose=0",
    ]
    server = ServerProcess([repository], ports).start(timeout=180)
    deadline = time.monotonic() + 180
    while not _ready(server):  # every worker joined
        if time.monotonic() > deadline:
            raise SystemExit(f"the server of {workers} workers was not ready within 180 s:\n{server.log}")
        time.sleep(0.2)
    return server


def _ready(server: ServerProcess) -> bool:
    try:
        with urllib.request.urlopen(f"http://{server.http_url}/v2/health/ready", timeout=5) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def measure(server: ServerProcess, path: str, concurrency: int, seconds: float, threads: int) -> Load:
    if path == "http-json":
        url = f"http://{server.http_url}/v2/models/add/infer"
        return retrying(lambda: wrk(url, concurrency, seconds, json_body(), threads=threads))
    if path == "sequence-json":
        url = f"http://{server.http_url}/v2/models/add_sequence/infer"
        return retrying(lambda: wrk(url, concurrency, seconds, sequence_body(), threads=threads))
    if path == "python-json":
        url = f"http://{server.http_url}/v2/models/{PYTHON_MODEL}/infer"
        return retrying(lambda: wrk(url, concurrency, seconds, PYTHON_JSON_BODY, threads=threads))
    if path == "grpc":
        message = grpc_request().SerializeToString()  # type: ignore[attr-defined]
        return retrying(
            lambda: h2load_grpc(server.grpc_url, METHOD, message, concurrency, seconds, threads=threads)
        )
    done = asyncio.run(openai_stream_round(openai_url(server), concurrency, seconds, MAX_TOKENS))
    return Load(requests_per_s=done.tokens_per_second, p50_ms=done.ttft_ms_median,
                p90_ms=done.ttft_ms_p90, p99_ms=done.ttft_ms_p90, tool="aiohttp")  # fmt: skip


def sequence_body() -> bytes:
    """The add model's JSON body as a whole sequence: the load generator numbers each one."""
    document = json.loads(json_body())
    document["parameters"] = {"sequence_id": 0, "sequence_start": True, "sequence_end": True}
    return json.dumps(document).replace('"sequence_id": 0', '"sequence_id": __SEQUENCE_ID__').encode()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    cores = os.cpu_count() or 1
    parser.add_argument("--workers", type=int, default=cores, help="N (default: the machine's cores)")
    parser.add_argument("--seconds", type=float, default=4.0, help="length of each trial")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of alternating trials")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument("--load-threads", type=int, default=max(1, cores // 4))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        repository = openai_repository(Path(folder) / "models")
        write_model(repository, "add", add_model(), CONFIG)
        write_model(repository, "add_sequence", add_model(), CONFIG + "sequence_batching { }\n")
        write_python_model(repository)
        servers = {1: start(repository, 1), args.workers: start(repository, args.workers)}
        try:
            for server in servers.values():
                grpc_call_succeeds(server.grpc_url, METHOD, grpc_request().SerializeToString())  # type: ignore[attr-defined]
            loads: dict[tuple[str, int, int], list[Load]] = {}
            for index in range(args.rounds):
                order = list(servers) if index % 2 == 0 else list(reversed(servers))
                for path in args.paths:
                    for concurrency in args.concurrency:
                        for workers in order:
                            load = measure(
                                servers[workers], path, concurrency, args.seconds, args.load_threads
                            )
                            if load.errors:  # a figure of failed requests measures nothing
                                raise SystemExit(
                                    f"{path} at {concurrency} on {workers} workers: {load.errors} requests failed"
                                )
                            loads.setdefault((path, concurrency, workers), []).append(load)
        finally:
            for server in servers.values():
                server.close()
    rows, results = [], []
    for path in args.paths:
        for concurrency in args.concurrency:
            one, many = loads[(path, concurrency, 1)], loads[(path, concurrency, args.workers)]
            ratios = [b.requests_per_s / a.requests_per_s for a, b in zip(one, many, strict=True)]
            p99_one, p99_many = median([a.p99_ms for a in one]), median([b.p99_ms for b in many])
            row = [path, concurrency, median([a.requests_per_s for a in one]),
                   median([b.requests_per_s for b in many]), median(ratios), min(ratios), max(ratios),
                   p99_one, p99_many]  # fmt: skip
            rows.append(row)
            results.append(dict(zip(COLUMNS, row, strict=True)))
    unit = "requests/s (openai-stream: tokens/s, p99: TTFT p90)"
    table = print_table(
        f"1 worker against {args.workers}, median of {args.rounds} alternating rounds of {args.seconds:g} s; {unit}",
        COLUMNS,
        rows,
    )
    print(f"\nwrote {write_results('workers', args, [table], {'results': results})}")


COLUMNS = [
    "path",
    "concurrency",
    "1 worker",
    "N workers",
    "ratio",
    "ratio min",
    "ratio max",
    "p99 ms 1",
    "p99 ms N",
]

if __name__ == "__main__":
    main()
