"""Python-model stubs that crash under load: what the other requests pay (issue 34).

    PYTHONPATH=... python -m benchmarks.python.python_crashes [--clients 16] [--requests 250]
        [--crash-every 20] [--instances 1] [--init-seconds 8] [--waiters 8]

Counts, not timings: run it with PYTHONPATH pointing at one checkout, then at another, to
compare their code (the server and its stubs run with the PYTHONPATH given).

Part 1, crashes under load: --clients HTTP clients each send --requests requests to a Python
model (--instances instances, pipeline_depth at its default); every --crash-every-th request
of each client holds the sentinel on which model.py calls os._exit(1). It counts the good
requests answered right and those that failed, by status, and the statuses of the crashing
ones. The model's initialize() is quick.

Part 2, a slow restart: a model whose initialize() takes --init-seconds on every start but the
first (one instance). One crashing request, then, while the stub restarts, --waiters HTTP
requests (no timeout) and --waiters gRPC requests whose deadline (a quarter of the restart)
runs out before it ends. /v2/models/{m}/ready is sampled every 0.1 s from the crash until
the first request is answered after it. Writes benchmarks/results/python_crashes.json.
"""

from __future__ import annotations

import argparse
import collections
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from benchmarks.support.reporting import Table, write_results
from coreserve.testing import ServerProcess

CRASH = -1.0
MODEL = """
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        marker = os.path.join(args["model_repository"], "started")
        if os.path.exists(marker):
            time.sleep({init_seconds})
        open(marker, "w").close()

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if x[0] == {crash}:
                os._exit(1)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x * 2)]))
        return responses
"""
CONFIG = """
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
"""


def write_model(repository: Path, name: str, init_seconds: float, count: int) -> None:
    (repository / name / "1").mkdir(parents=True)
    (repository / name / "1" / "model.py").write_text(MODEL.format(init_seconds=init_seconds, crash=CRASH))
    (repository / name / "config.pbtxt").write_text(CONFIG.format(count=count))


# The first error message seen for each status, to print with the counts.
MESSAGES: dict[str, str] = {}


def http_infer(client: httpclient.InferenceServerClient, model: str, value: float) -> str:
    """'ok', 'wrong', or the error's HTTP status."""
    tensor = httpclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.array([value], np.float32))
    try:
        result = client.infer(model, [tensor])
    except InferenceServerException as exc:
        MESSAGES.setdefault(f"{'crashing' if value == CRASH else 'good'} {exc.status()}", exc.message())
        return str(exc.status())
    return "ok" if result.as_numpy("OUTPUT0").tolist() == [value * 2] else "wrong"


def grpc_infer(url: str, model: str, value: float, deadline_s: float) -> str:
    client = grpcclient.InferenceServerClient(url)
    tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.array([value], np.float32))
    try:
        result = client.infer(model, [tensor], client_timeout=deadline_s)
    except InferenceServerException as exc:
        return str(exc.status())
    finally:
        client.close()
    return "ok" if result.as_numpy("OUTPUT0").tolist() == [value * 2] else "wrong"


def ready(server: ServerProcess, model: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{model}/ready", timeout=10) as reply:
            return bool(reply.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def crashes_under_load(server: ServerProcess, args: argparse.Namespace) -> tuple[Table, dict[str, object]]:
    """Part 1; returns its table and figures for the results file."""
    good: collections.Counter[str] = collections.Counter()
    crashing: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()

    def client_loop(index: int) -> None:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
        try:
            for number in range(1, args.requests + 1):
                crash = number % args.crash_every == 0
                outcome = http_infer(client, "under_load", CRASH if crash else float(index * 10_000 + number))
                with lock:
                    (crashing if crash else good)[outcome] += 1
        finally:
            client.close()

    began = time.monotonic()
    with ThreadPoolExecutor(args.clients) as pool:
        list(pool.map(client_loop, range(args.clients)))
    took = time.monotonic() - began
    print(
        f"part 1: {args.clients} clients x {args.requests} requests, every {args.crash_every}th crashes "
        f"({args.instances} instance(s)), {took:.1f} s"
    )
    print(f"  good requests:     {sum(good.values())}: {dict(sorted(good.items()))}")
    print(f"  crashing requests: {sum(crashing.values())}: {dict(sorted(crashing.items()))}")
    for outcome, message in sorted(MESSAGES.items()):
        print(f"  {outcome}: {message}")
    table = Table(
        f"Crashes under load: {args.clients} clients x {args.requests} requests, every {args.crash_every}th "
        f"crashes, {args.instances} instance(s)",
        ["requests", "count", "outcomes (ok, wrong or HTTP status)", "run s"],
        [
            ["good", sum(good.values()), _outcomes(good), took],
            ["crashing", sum(crashing.values()), _outcomes(crashing), took],
        ],
    )
    return table, {
        "good": dict(good),
        "crashing": dict(crashing),
        "seconds": took,
        "messages": dict(MESSAGES),
    }


def _outcomes(counter: collections.Counter[str]) -> str:
    return ", ".join(f"{outcome} {count}" for outcome, count in sorted(counter.items()))


def slow_restart(server: ServerProcess, args: argparse.Namespace) -> tuple[Table, dict[str, object]]:
    """Part 2; returns its table and figures for the results file."""
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    assert http_infer(client, "slow_restart", 1.0) == "ok"
    crashed = http_infer(client, "slow_restart", CRASH)
    began = time.monotonic()
    samples: list[bool] = []
    answered = threading.Event()

    def sample() -> None:
        while not answered.is_set() and time.monotonic() - began < args.init_seconds * 3 + 30:
            samples.append(ready(server, "slow_restart"))
            time.sleep(0.1)

    def waiter_http(value: float) -> tuple[str, float]:
        own = httpclient.InferenceServerClient(server.http_url, network_timeout=args.init_seconds * 3 + 60)
        try:
            outcome = http_infer(own, "slow_restart", value)
        finally:
            own.close()
            answered.set()
        return outcome, time.monotonic() - began

    def waiter_grpc(value: float) -> tuple[str, float]:
        return grpc_infer(
            server.grpc_url, "slow_restart", value, args.init_seconds / 4
        ), time.monotonic() - began

    sampler = threading.Thread(target=sample)
    sampler.start()
    with ThreadPoolExecutor(2 * args.waiters) as pool:
        http_waits = [pool.submit(waiter_http, float(n)) for n in range(args.waiters)]
        grpc_waits = [pool.submit(waiter_grpc, float(n)) for n in range(args.waiters)]
        http_results = [future.result() for future in http_waits]
        grpc_results = [future.result() for future in grpc_waits]
    sampler.join()
    client.close()
    print(f"part 2: a crash, then a restart whose initialize() takes {args.init_seconds} s")
    print(f"  the crashing request: {crashed}")
    print(
        f"  ready samples until the first answer: {samples.count(False)} not ready, {samples.count(True)} ready"
    )
    rows: list[list[object]] = [
        ["the crashing request", 1, crashed, "-"],
        ["ready samples until the first answer", len(samples), f"not ready {samples.count(False)}, ready {samples.count(True)}", "-"],
    ]  # fmt: skip
    for name, results in (
        ("HTTP, no timeout", http_results),
        (f"gRPC, {args.init_seconds / 4:.1f} s deadline", grpc_results),
    ):
        outcomes = collections.Counter(outcome for outcome, _ in results)
        latest = max(when for _, when in results)
        print(
            f"  {len(results)} requests sent during the restart ({name}): {dict(outcomes)}, last ended at {latest:.1f} s"
        )
        rows.append([f"sent during the restart ({name})", len(results), _outcomes(outcomes), latest])
    table = Table(
        f"A crash, then a restart whose initialize() takes {args.init_seconds:g} s",
        ["what", "count", "outcomes", "last ended at s"],
        rows,
    )
    return table, {
        "crashed": crashed,
        "ready_samples": samples,
        "http_waiters": http_results,
        "grpc_waiters": grpc_results,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=250, help="per client")
    parser.add_argument("--crash-every", type=int, default=20)
    parser.add_argument("--instances", type=int, default=1)
    parser.add_argument("--init-seconds", type=float, default=8.0)
    parser.add_argument("--waiters", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        repository = Path(folder)
        write_model(repository, "under_load", 0.0, args.instances)
        write_model(repository, "slow_restart", args.init_seconds, 1)
        server = ServerProcess([repository], ["--log-verbose=0"]).start(timeout=120)
        try:
            under_load, under_load_data = crashes_under_load(server, args)
            restart, restart_data = slow_restart(server, args)
            log = server.log
        finally:
            server.stop()
    print(f"server log: {log.count('Traceback')} tracebacks")
    data = {
        "under_load": under_load_data,
        "slow_restart": restart_data,
        "tracebacks_in_log": log.count("Traceback"),
    }
    print(f"results: {write_results('python_crashes', args, [under_load, restart], data)}")


if __name__ == "__main__":
    main()
