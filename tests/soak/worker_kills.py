"""A bounded soak of a server of several workers whose workers are killed under traffic.

    python tests/soak/worker_kills.py [--minutes 2] [--workers 2] [--concurrency 6] [--kill-every 10]

It starts `coreserve --http-thread-count N --grpc-infer-thread-count N` over a repository of
the add_sub ONNX model and the `counter` sequence model (which worker 0 serves for every
worker). `--concurrency` threads send, each on a new connection (so over every worker), add_sub
requests over HTTP and gRPC and whole sequences of five requests to `counter`; every
`--kill-every` seconds a worker is killed with SIGKILL, worker 0 and the others in turn.

A request may fail only in a kill's window (from the kill until the server is ready again,
and two seconds more): with a broken connection, UNAVAILABLE, NOT_FOUND for a model whose
worker 0 is down, or a sequence that lost its state with worker 0. Outside those windows
any error fails the run, as do a sequence whose sums are wrong, a statistics count of add_sub
that falls back, a worker missing at the end, and a traceback in the log. Writes
benchmarks/results/soak_worker_kills.json. Linux only (/proc). Every loop is bounded by
`--minutes` and `--max-requests`; pytest does not collect it (no `test_` prefix).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import signal
import socket
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

# Its tables and results file are the benchmarks' kind; its models are the tests' own.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.support.reporting import print_table, write_results
from coreserve.testing import ServerProcess
from support.model_builders import (
    ACCUMULATOR_SEQUENCE_CONFIG,
    ADD_SUB_CONFIG,
    accumulator_model,
    add_sub_model,
    write_model,
)

AFTER_READY_S = 2.0  # a kill's window lasts this long past the server's readiness
# What a request may get in a kill's window: the words of each error a restart explains.
EXPLAINED = (
    "StatusCode.UNAVAILABLE",
    "[503]",
    "not reachable",
    "stopped before it answered",
    "must specify the START flag",  # worker 0 died with the sequence, or it ended
    "has no available versions",
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Run:
    """What the clients saw, and when the server was being restarted."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.unexplained: list[str] = []
        self.windows: list[list[float]] = []  # [kill time, end of its window (inf: not ready yet)]

    def in_window(self, started: float) -> bool:
        with self.lock:
            return any(start - 0.5 <= started <= end for start, end in self.windows)

    def outcome(self, kind: str, started: float, error: Exception | None) -> None:
        with self.lock:
            if error is None:
                self.counts[f"{kind} ok"] += 1
                return
        text = f"{type(error).__name__}: {error}"
        broken = isinstance(error, OSError) or "Connection" in type(error).__name__  # (geventhttpclient's)
        explained = broken or any(words in text for words in EXPLAINED)
        if explained and self.in_window(started):
            with self.lock:
                self.counts[f"{kind} failed in a kill's window"] += 1
            return
        with self.lock:
            self.counts[f"{kind} failed outside"] += 1
            if len(self.unexplained) < 20:
                self.unexplained.append(text[:300])


def add_request(server: ServerProcess, use_grpc: bool) -> None:
    module = grpcclient if use_grpc else httpclient
    with module.InferenceServerClient(server.grpc_url if use_grpc else server.http_url) as client:
        inputs = []
        for name in ("INPUT0", "INPUT1"):
            tensor = module.InferInput(name, [1, 4], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
            inputs.append(tensor)
        result = client.infer("add_sub", inputs)
    if result.as_numpy("OUTPUT0").tolist() != [[2.0] * 4]:
        raise AssertionError(f"add_sub answered {result.as_numpy('OUTPUT0').tolist()}")


def sequence(server: ServerProcess, sequence_id: int, use_grpc: bool) -> None:
    module = grpcclient if use_grpc else httpclient
    values = [random.randint(1, 9) for _ in range(5)]
    for step, value in enumerate(values):
        with module.InferenceServerClient(server.grpc_url if use_grpc else server.http_url) as client:
            tensor = module.InferInput("INPUT", [1, 1], "INT32")
            tensor.set_data_from_numpy(np.array([[value]], np.int32))
            result = client.infer("counter", [tensor], sequence_id=sequence_id, sequence_start=step == 0,
                                  sequence_end=step == len(values) - 1)  # fmt: skip
        total = int(result.as_numpy("OUTPUT")[0, 0])
        if total != sum(values[: step + 1]):
            wanted = sum(values[: step + 1])
            raise AssertionError(f"sequence {sequence_id} summed {total} at step {step}, not {wanted}")


def ready(server: ServerProcess) -> bool:
    try:
        with urllib.request.urlopen(f"http://{server.http_url}/v2/health/ready", timeout=5) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def serving(server: ServerProcess, supervisor: int, workers: int) -> bool:
    """Every worker is there and the server says it is ready."""
    return len(workers_of(supervisor)) == workers and ready(server)


def add_sub_count(server: ServerProcess) -> int | None:
    try:
        with urllib.request.urlopen(f"http://{server.http_url}/v2/models/stats", timeout=10) as answer:
            stats = json.load(answer)["model_stats"]
    except OSError:
        return None
    return next((int(m["inference_count"]) for m in stats if m["name"] == "add_sub"), None)


def workers_of(pid: int) -> dict[int, int]:
    """The supervisor's workers: worker index -> process id."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if int(Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[1]) != pid:
                continue
            environment = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        role = next((v for v in environment if v.startswith(b"CORESERVE_WORKER=")), None)
        if role is not None:
            found[int(role.split(b"=", 1)[1].split(b"/")[0])] = int(entry)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=2.0, help="how long traffic is sent (default 2)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--concurrency", type=int, default=6, help="client threads (default 6)")
    parser.add_argument("--kill-every", type=float, default=10.0, help="seconds between kills (default 10)")
    parser.add_argument("--max-requests", type=int, default=200_000, help="a bound on the requests sent")
    args = parser.parse_args()
    run = Run()
    counts_seen: list[int] = []
    with tempfile.TemporaryDirectory() as folder:
        repository = Path(folder)
        write_model(repository, "add_sub", add_sub_model(), ADD_SUB_CONFIG)
        write_model(repository, "counter", accumulator_model(), ACCUMULATOR_SEQUENCE_CONFIG)
        flags = [f"--http-port={free_port()}", f"--grpc-port={free_port()}", f"--http-thread-count={args.workers}",
                 f"--grpc-infer-thread-count={args.workers}"]  # fmt: skip
        server = ServerProcess([repository], flags).start(timeout=180)
        assert server.process is not None
        deadline = time.monotonic() + args.minutes * 60
        sent = 0
        next_id = iter(range(1, 10**9))

        def client() -> None:
            nonlocal sent
            while time.monotonic() < deadline and sent < args.max_requests:
                sent += 1
                kind = random.choice(["add http", "add grpc", "sequence http", "sequence grpc"])
                started = time.monotonic()
                try:
                    if kind.startswith("add"):
                        add_request(server, kind.endswith("grpc"))
                    else:
                        sequence(server, next(next_id), kind.endswith("grpc"))
                except (
                    Exception
                ) as error:  # the server's error, a broken connection; wrong sums are never explained
                    run.outcome(kind, started, error)
                else:
                    run.outcome(kind, started, None)

        supervisor = server.process.pid

        def killer() -> None:
            victim = 0
            while time.monotonic() + args.kill_every < deadline:
                time.sleep(args.kill_every)
                pid = workers_of(supervisor).get(victim)
                if pid is not None:
                    window = [time.monotonic(), float("inf")]
                    with run.lock:
                        run.windows.append(window)
                        run.counts[f"worker {victim} killed"] += 1
                    os.kill(pid, signal.SIGKILL)
                    limit = time.monotonic() + 120
                    while time.monotonic() < limit:
                        if pid not in workers_of(supervisor).values() and serving(
                            server, supervisor, args.workers
                        ):
                            break
                        time.sleep(0.1)
                    with run.lock:
                        window[1] = time.monotonic() + AFTER_READY_S
                victim = (victim + 1) % args.workers
                count = add_sub_count(server)
                if count is not None:
                    counts_seen.append(count)

        threads = [threading.Thread(target=client) for _ in range(args.concurrency)]
        threads.append(threading.Thread(target=killer))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=args.minutes * 60 + 300)
        survivors = workers_of(supervisor)
        final_count = add_sub_count(server)
        log = server.log
        server.close()
    failures = []
    if run.unexplained:
        failures.append(f"{len(run.unexplained)}+ requests failed outside a kill's window")
    if any(later < earlier for earlier, later in itertools.pairwise(counts_seen)):
        failures.append(f"add_sub's count fell back: {counts_seen}")
    if len(survivors) != args.workers:
        failures.append(f"{len(survivors)} workers at the end, not {args.workers}")
    if "Traceback" in log:
        failures.append("a traceback in the log")
    rows = [[name, count] for name, count in sorted(run.counts.items())]
    table = print_table(f"{args.workers} workers killed in turn every {args.kill_every:g} s for {args.minutes:g} min",
                        ["outcome", "count"], rows)  # fmt: skip
    path = write_results(
        "soak_worker_kills", args, [table],
        {"counts": dict(run.counts), "unexplained": run.unexplained, "add_sub_counts": counts_seen,
         "final_add_sub_count": final_count, "failures": failures},
    )  # fmt: skip
    print(f"results: {path}")
    if failures:
        print("FAILED: " + "; ".join(failures) + "\n" + "\n".join(run.unexplained))
        raise SystemExit(1)
    print("PASSED: every failure fell in a kill's window, sums and counts held")


if __name__ == "__main__":
    main()
