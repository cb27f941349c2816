"""A bounded soak: mixed good and bad traffic over HTTP and gRPC, watching the server's resources.

    python tests/soak/soak.py [--minutes 2] [--concurrency 8] [--max-requests 200000]
                              [--server-cmd "COMMAND"]

By default it starts `coreserve` over examples/model_repository on free ports of 127.0.0.1,
with `--http-max-input-size=1048576` so that bodies over the limit (2 MiB) stay cheap to
send. `--server-cmd` runs another command instead (tritonserver, a coreserve with other
flags); it must log "Started HTTPService at HOST:PORT" and "Started GRPCInferenceService at
HOST:PORT" as both servers do, listen on 127.0.0.1, serve examples/model_repository and
refuse bodies over 1 MiB.

`--concurrency` threads send, for `--minutes` or until `--max-requests` in all: valid infers
with tritonclient (HTTP and gRPC, the ONNX `simple` model and the Python-backed
`ensemble_pipeline`), malformed JSON, wrong shapes, unknown models, truncated bodies, bodies
over the size limit, and half-open connections dropped midway. Every few seconds it samples
the server process: resident memory, open descriptors (/proc/PID/fd), threads and child
processes (Python model stubs).

Growth is judged after a warm-up: the median of the last third of the samples against the
median of the middle third. The run fails (exit 1) when RSS grows by more than
`--rss-growth-percent` and more than `--rss-growth-mb` both, when descriptors grow by more
than `--fd-growth`, threads by more than `--thread-growth`, or child processes at all; and
when an answer is a 5xx or not the status a request of its kind must get, or the server log
holds a traceback. Writes benchmarks/results/soak.json. Linux only (/proc).

It lives beside the tests but pytest does not collect it (no `test_` prefix): it takes minutes,
so it is run by hand, and every loop in it is bounded by `--minutes` and `--max-requests`.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import shlex
import socket
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

# Its tables and results file are the benchmarks' kind.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.support.reporting import Table, print_table, write_results
from coreserve.testing import ServerProcess

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "model_repository"
SIMPLE_INPUT = np.arange(16, dtype=np.int32).reshape(1, 16)
# The default server's body limit is lowered so that bodies over it stay cheap to send.
MAX_INPUT_SIZE = 1024 * 1024
OVERSIZED_BODY = 2 * MAX_INPUT_SIZE


@dataclass
class Sample:
    """The server's resources at one moment."""

    seconds: float
    rss_mb: float
    fds: int
    threads: int
    children: int


def sample(pid: int, started: float) -> Sample:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return Sample(
        seconds=round(time.monotonic() - started, 1),
        rss_mb=int(fields["VmRSS"].split()[0]) / 1024,
        fds=len(os.listdir(f"/proc/{pid}/fd")),
        threads=int(fields["Threads"]),
        children=len(child_processes(pid)),
    )


def child_processes(pid: int) -> list[int]:
    """The processes whose parent is `pid` (any of its threads may have started them)."""
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # it ended meanwhile
        if int(stat.rpartition(")")[2].split()[1]) == pid:
            children.append(int(entry))
    return children


class Outcomes:
    """Counts per kind of request: answers as expected, and the unexpected ones with examples."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.expected: Counter[str] = Counter()
        self.unexpected: Counter[str] = Counter()
        self.examples: dict[str, str] = {}
        self.total = 0

    def record(self, kind: str, ok: bool, detail: str = "") -> None:
        with self.lock:
            self.total += 1
            if ok:
                self.expected[kind] += 1
            else:
                self.unexpected[kind] += 1
                self.examples.setdefault(kind, detail[:300])


class Traffic:
    """One thread's clients and the kinds of request it sends, each with the answer it must get."""

    def __init__(self, server: ServerProcess, outcomes: Outcomes, rng: random.Random) -> None:
        self.http_address = ("127.0.0.1", server.ports["HTTP"])
        self.http = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
        self.grpc = grpcclient.InferenceServerClient(server.grpc_url)
        self.outcomes = outcomes
        self.rng = rng
        # (kind, weight, call): valid traffic is most of it, as in real life.
        self.kinds: list[tuple[str, int, Callable[[], tuple[bool, str]]]] = [
            ("http infer", 30, self.http_infer),
            ("grpc infer", 30, self.grpc_infer),
            ("http ensemble (python stubs)", 4, self.http_ensemble),
            ("malformed json", 6, self.malformed_json),
            ("wrong shape http", 5, self.wrong_shape_http),
            ("wrong shape grpc", 5, self.wrong_shape_grpc),
            ("unknown model http", 3, self.unknown_model_http),
            ("unknown model grpc", 3, self.unknown_model_grpc),
            ("truncated body", 4, self.truncated_body),
            ("oversized body", 2, self.oversized_body),
            ("half-open connection", 4, self.half_open),
        ]
        self.weights = [weight for _, weight, _ in self.kinds]

    def close(self) -> None:
        self.http.close()
        self.grpc.close()

    def send_one(self) -> None:
        kind, _, call = self.rng.choices(self.kinds, self.weights)[0]
        try:
            ok, detail = call()
        except (OSError, InferenceServerException, grpc.RpcError) as exc:
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        self.outcomes.record(kind, ok, detail)

    # Valid requests: the answer must be right.
    def http_infer(self) -> tuple[bool, str]:
        inputs = [httpclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(SIMPLE_INPUT, binary_data=self.rng.random() < 0.5)
        result = self.http.infer("simple", inputs)
        return bool(np.array_equal(result.as_numpy("OUTPUT0"), SIMPLE_INPUT * 2)), "wrong OUTPUT0"

    def grpc_infer(self) -> tuple[bool, str]:
        inputs = [grpcclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(SIMPLE_INPUT)
        result = self.grpc.infer("simple", inputs, client_timeout=60)
        return bool(np.array_equal(result.as_numpy("OUTPUT1"), SIMPLE_INPUT * 0)), "wrong OUTPUT1"

    def http_ensemble(self) -> tuple[bool, str]:
        text = httpclient.InferInput("TEXT", [1, 1], "BYTES")
        text.set_data_from_numpy(np.array([[b"a soak test"]], dtype=np.object_))
        result = self.http.infer("ensemble_pipeline", [text])
        return result.as_numpy("SCORE").shape == (1, 1), "wrong SCORE shape"

    # Client mistakes: the answer must be the client error of its kind.
    def _post(self, path: str, body: bytes, headers: dict[str, str] | None = None) -> int:
        connection = http.client.HTTPConnection(*self.http_address, timeout=60)
        try:
            connection.request("POST", path, body=body, headers=headers or {})
            response = connection.getresponse()
            response.read()
            return response.status
        finally:
            connection.close()

    def malformed_json(self) -> tuple[bool, str]:
        body = self.rng.choice([b'{"inputs": [', b"[]", b'{"inputs": 3}', b"\xff\xfe", b'{"inputs": [{}]}'])
        status = self._post("/v2/models/simple/infer", body)
        return status == 400, f"{status} for {body!r}"

    def wrong_shape_http(self) -> tuple[bool, str]:
        document = {
            "inputs": [
                {"name": name, "datatype": "INT32", "shape": [1, 15], "data": list(range(15))}
                for name in ("INPUT0", "INPUT1")
            ]
        }
        status = self._post("/v2/models/simple/infer", json.dumps(document).encode())
        return status == 400, f"{status} for shape [1, 15]"

    def wrong_shape_grpc(self) -> tuple[bool, str]:
        data = np.zeros((1, 15), dtype=np.int32)
        inputs = [grpcclient.InferInput(name, [1, 15], "INT32") for name in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(data)
        try:
            self.grpc.infer("simple", inputs, client_timeout=60)
        except InferenceServerException as exc:
            return exc.status() == "StatusCode.INVALID_ARGUMENT", f"{exc.status()}: {exc.message()}"
        return False, "a wrong shape was accepted"

    def unknown_model_http(self) -> tuple[bool, str]:
        status = self._post("/v2/models/no_such_model/infer", b'{"inputs": []}')
        return status == 404, f"{status} for an unknown model"

    def unknown_model_grpc(self) -> tuple[bool, str]:
        try:
            self.grpc.get_model_metadata("no_such_model")
        except InferenceServerException as exc:
            return exc.status() == "StatusCode.NOT_FOUND", f"{exc.status()}: {exc.message()}"
        return False, "an unknown model was found"

    # Broken connections: the server must drop them and forget them.
    def truncated_body(self) -> tuple[bool, str]:
        with socket.create_connection(self.http_address, timeout=60) as sock:
            sock.sendall(
                b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: soak\r\nContent-Length: 1000\r\n\r\n"
                + b'{"inputs": [{"name": "INPUT0"'
            )
        return True, ""

    def oversized_body(self) -> tuple[bool, str]:
        """A body over the size limit: announced with `Expect: 100-continue`, or sent whole."""
        announced = self.rng.random() < 0.5
        head = b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: soak\r\n"
        with socket.create_connection(self.http_address, timeout=60) as sock:
            if announced:
                sock.sendall(head + b"Expect: 100-continue\r\nContent-Length: 1099511627776\r\n\r\n")
            else:
                body = b"x" * (OVERSIZED_BODY)
                sock.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
            answer = b""
            while b"\r\n" not in answer:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                answer += chunk
        return answer.startswith(b"HTTP/1.1 413"), f"{'announced' if announced else 'sent'}: {answer[:80]!r}"

    def half_open(self) -> tuple[bool, str]:
        with socket.create_connection(self.http_address, timeout=60) as sock:
            sock.sendall(b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: soak\r\nContent-Le")
            time.sleep(self.rng.uniform(0, 1.0))
        return True, ""


def growth(samples: list[Sample], warmup: float) -> dict[str, float]:
    """Median of the last third minus median of the middle third of the samples after warm-up."""
    settled = [s for s in samples if s.seconds >= warmup]
    third = len(settled) // 3
    if third < 2:
        raise SystemExit(f"only {len(settled)} samples after the warm-up: run longer or sample more often")
    middle, last = settled[third : 2 * third], settled[2 * third :]
    return {
        name: statistics.median(getattr(s, name) for s in last)
        - statistics.median(getattr(s, name) for s in middle)
        for name in ("rss_mb", "fds", "threads", "children")
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=2.0, help="how long traffic is sent (default 2)")
    parser.add_argument("--concurrency", type=int, default=8, help="client threads (default 8)")
    parser.add_argument(
        "--max-requests", type=int, default=200_000, help="stop after this many requests (default 200000)"
    )
    parser.add_argument(
        "--sample-secs", type=float, default=4.0, help="seconds between resource samples (default 4)"
    )
    parser.add_argument(
        "--warmup-secs", type=float, default=20.0, help="samples before this are not judged (default 20)"
    )
    parser.add_argument(
        "--server-cmd", help="start this command instead of coreserve over examples/model_repository"
    )
    parser.add_argument(
        "--rss-growth-percent", type=float, default=10.0, help="RSS growth that fails, in %% (default 10)"
    )
    parser.add_argument(
        "--rss-growth-mb", type=float, default=20.0, help="... and in MB (default 20; both must be exceeded)"
    )
    parser.add_argument("--fd-growth", type=int, default=16, help="descriptor growth that fails (default 16)")
    parser.add_argument("--thread-growth", type=int, default=8, help="thread growth that fails (default 8)")
    args = parser.parse_args()

    server = ServerProcess([EXAMPLES], ["--log-verbose=0", f"--http-max-input-size={MAX_INPUT_SIZE}"])
    if args.server_cmd:
        server.args = shlex.split(args.server_cmd)
    server.start(timeout=180, wait_for=("HTTP", "GRPC"))
    assert server.process is not None
    pid = server.process.pid
    outcomes = Outcomes()
    samples: list[Sample] = []
    started = time.monotonic()
    deadline = started + args.minutes * 60
    stop = threading.Event()

    def client(seed: int) -> None:
        traffic = Traffic(server, outcomes, random.Random(seed))
        try:
            while not stop.is_set() and time.monotonic() < deadline and outcomes.total < args.max_requests:
                traffic.send_one()
        finally:
            traffic.close()

    try:
        samples.append(sample(pid, started))
        threads = [
            threading.Thread(target=client, args=(seed,), daemon=True) for seed in range(args.concurrency)
        ]
        for thread in threads:
            thread.start()
        while any(thread.is_alive() for thread in threads):
            time.sleep(args.sample_secs)
            if server.process.poll() is not None:
                stop.set()
                raise SystemExit(f"the server exited with {server.process.returncode} during the soak")
            samples.append(sample(pid, started))
        for thread in threads:
            thread.join()
        loaded = time.monotonic() - started
        time.sleep(3)  # idle: dropped connections and finished requests are released
        idle = sample(pid, started)
        log = server.log
    finally:
        stop.set()
        server.close()

    changes = growth(samples, args.warmup_secs)
    middle_rss = statistics.median(s.rss_mb for s in samples if s.seconds >= args.warmup_secs)
    failures = []
    if (
        changes["rss_mb"] > args.rss_growth_mb
        and changes["rss_mb"] > middle_rss * args.rss_growth_percent / 100
    ):
        failures.append(f"RSS grew by {changes['rss_mb']:.1f} MB")
    if changes["fds"] > args.fd_growth:
        failures.append(f"open descriptors grew by {changes['fds']:.0f}")
    if changes["threads"] > args.thread_growth:
        failures.append(f"threads grew by {changes['threads']:.0f}")
    if changes["children"] > 0:
        failures.append(f"child processes grew by {changes['children']:.0f}")
    if outcomes.unexpected:
        failures.append(f"{sum(outcomes.unexpected.values())} unexpected answers")
    tracebacks = log.count("Traceback")
    if tracebacks:
        failures.append(f"{tracebacks} tracebacks in the server log")

    rows = [["start", *_values(samples[0])]]
    middle = samples[1:-1]
    step = max(1, len(middle) // 12)  # a dozen rows are enough to read; the JSON has them all
    rows += [[f"{s.seconds:.0f} s", *_values(s)] for s in middle[step - 1 :: step]]
    rows += [["end of load", *_values(samples[-1])], ["end + 3 s idle", *_values(idle)]]
    tables: list[Table] = []
    tables.append(
        print_table(
            f"Server resources over {loaded:.0f} s, {outcomes.total} requests at concurrency {args.concurrency}",
            ["when", "RSS MB", "fds", "threads", "children"],
            rows,
        )
    )
    kinds = sorted(set(outcomes.expected) | set(outcomes.unexpected))
    tables.append(
        print_table(
            "Requests by kind",
            ["kind", "as expected", "unexpected", "example of unexpected"],
            [[k, outcomes.expected[k], outcomes.unexpected[k], outcomes.examples.get(k, "")] for k in kinds],
        )
    )
    print(
        "\ngrowth, median of the last third minus median of the middle third (after "
        f"{args.warmup_secs:.0f} s of warm-up): "
        + ", ".join(f"{name} {value:+.1f}" for name, value in changes.items())
    )
    path = write_results(
        "soak",
        args,
        tables,
        {
            "requests": outcomes.total,
            "requests_per_s": outcomes.total / loaded,
            "expected": dict(outcomes.expected),
            "unexpected": dict(outcomes.unexpected),
            "unexpected_examples": outcomes.examples,
            "samples": [asdict(s) for s in samples],
            "idle": asdict(idle),
            "growth": changes,
            "tracebacks_in_log": tracebacks,
            "failures": failures,
        },
    )
    print(f"results: {path}")
    if failures:
        print("FAILED: " + "; ".join(failures))
        raise SystemExit(1)
    print("PASSED: nothing grew without bound")


def _values(s: Sample) -> list[object]:
    return [s.rss_mb, s.fds, s.threads, s.children]


if __name__ == "__main__":
    main()
