"""Whether a large JSON infer request stalls the server, and whether its memory stays behind.

    python -m benchmarks.transports.large_json [--megabytes 60] [--requests 30] [--binary-output]

An ONNX Identity model (FP32 [-1]) gets `--requests` JSON infer requests of about
`--megabytes` MB each, one after another, each on a new connection; its answers are JSON too
(about as large), unless `--binary-output` asks for binary tensor data. Meanwhile a probe
process sends, every 20 ms, GET /v2/health/ready on a new connection and a small JSON infer on
a keep-alive connection. The figures: the latencies of the probes that started while a large
request was in progress (count, p50, p99, max), how long a large request took, and the
server's resident memory (VmRSS, and with its worker processes) at the start, its peak, and
after the last request. Targets (issue 34): health and small infer within 100 ms while a large
request is in progress; RSS within 200 MB of the start after 30 large requests.

Run it against another checkout by pointing PYTHONPATH at its `core` folder (the server runs
as `python -m coreserve` with this environment). The machine's CPU pressure (Linux PSI: the
share of time some task waited for a CPU) is printed with the figures: neighbours' work on a
shared machine shows up as latency here.

    python -m benchmarks.transports.large_json --objects-to /v2/trace/setting [--requests 10]

instead sends bodies of about `--megabytes` MB of small JSON objects (`{}`, millions of them) to
a control endpoint, which refuses them (400) before reading them; the same figures.

    python -m benchmarks.transports.large_json --small-against /path/to/other/checkout [--trials 5]

instead compares the small-body path of this checkout with another's: a small JSON infer
body, driven by wrk against one server of each in turn (the trials alternate), so that the
work for large bodies is seen to cost small ones nothing.
Writes benchmarks/results/large_json.json (or large_json_small.json; `--name` names it).
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing
import os
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np
import orjson

from benchmarks.support.load_generators import Load, wrk
from benchmarks.support.models import identity_onnx, start_server, write_model
from benchmarks.support.reporting import Table, print_table, write_results
from benchmarks.support.trials import median_load, rotated
from coreserve.testing import ServerProcess

CONFIG = """
backend: "onnxruntime"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
INFER = "/v2/models/identity/infer"
SMALL_BODY = orjson.dumps(
    {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]}
)
PROBE_PAUSE_S = 0.02
BYTES_PER_VALUE = 9  # "0.123456," once orjson writes a value rounded to six digits


def large_body(megabytes: float, binary_output: bool) -> tuple[bytes, np.ndarray]:
    """A JSON infer body of about `megabytes` MB: one flat FP32 input of six-digit values."""
    count = int(megabytes * 1e6 / BYTES_PER_VALUE)
    values = np.round(np.random.default_rng(7).random(count), 6)
    document: dict[str, object] = {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [count], "data": values.tolist()}]
    }
    if binary_output:
        document["outputs"] = [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]
    return orjson.dumps(document), values.astype(np.float32)


def _probe_loop(
    host: str, port: int, kind: str, stop: threading.Event, samples: list[tuple[float, float, str]]
) -> None:
    """Samples one kind of probe until `stop`: (start, seconds, error or "")."""
    keep_alive = http.client.HTTPConnection(host, port, timeout=30)
    while not stop.is_set():
        started = time.monotonic()
        error = ""
        try:
            if kind == "health":
                connection = http.client.HTTPConnection(host, port, timeout=30)
                connection.request("GET", "/v2/health/ready")
                status = connection.getresponse().status
                connection.close()
                if status != 200:
                    error = f"status {status}"
            else:
                keep_alive.request("POST", INFER, SMALL_BODY, {"Content-Type": "application/json"})
                response = keep_alive.getresponse()
                reply = response.read()
                if response.status != 200 or orjson.loads(reply)["outputs"][0]["data"] != [1, 2, 3, 4]:
                    error = f"status {response.status}: {reply[:200]!r}"
        except (OSError, http.client.HTTPException) as exc:
            error = repr(exc)
            keep_alive.close()
            keep_alive = http.client.HTTPConnection(host, port, timeout=30)
        samples.append((started, time.monotonic() - started, error))
        stop.wait(PROBE_PAUSE_S)
    keep_alive.close()


def probe_process(host: str, port: int, pipe: Connection) -> None:
    """Runs the health and small-infer probes until the pipe says stop; sends back the samples."""
    stop = threading.Event()
    samples: dict[str, list[tuple[float, float, str]]] = {"health": [], "small infer": []}
    threads = [
        threading.Thread(target=_probe_loop, args=(host, port, kind, stop, found), daemon=True)
        for kind, found in samples.items()
    ]
    for thread in threads:
        thread.start()
    pipe.send("started")
    pipe.recv()
    stop.set()
    for thread in threads:
        thread.join(60)
    pipe.send(samples)


def rss_mib(pid: int) -> float:
    """The resident memory of process `pid`, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def tree_rss_mib(pid: int) -> float:
    """The resident memory of process `pid` and its descendants (shared pages counted in each)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(entry))
    total, pending = 0.0, [pid]
    while pending:
        current = pending.pop()
        try:
            total += rss_mib(current)
        except OSError:
            continue
        pending.extend(children.get(current, []))
    return total


class RssPeak:
    """Polls the server tree's RSS every 50 ms for its peak."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = self.peak_tree = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self.peak = max(self.peak, rss_mib(self.pid))
                self.peak_tree = max(self.peak_tree, tree_rss_mib(self.pid))
            except OSError:
                return

    def __enter__(self) -> RssPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()


def objects_body(megabytes: float) -> bytes:
    """About `megabytes` MB of JSON holding millions of empty objects."""
    count = int(megabytes * 1e6 / 3)
    return b'{"x":[' + b"{}," * (count - 1) + b"{}]}"


def send_large(
    host: str, port: int, body: bytes, expected: np.ndarray | None, binary_output: bool, path: str = INFER
) -> int:
    """One large request on a new connection; checks its answer (in full when `expected`):
    200 for an infer, 400 from another endpoint (`path`)."""
    connection = http.client.HTTPConnection(host, port, timeout=300)
    try:
        connection.request("POST", path, body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        reply = response.read()
    finally:
        connection.close()
    if response.status != (200 if path == INFER else 400):
        raise SystemExit(f"a large request failed: {response.status} {reply[:300]!r}")
    if expected is not None:
        if binary_output:
            json_length = int(response.getheader("Inference-Header-Content-Length") or 0)
            output = np.frombuffer(reply[json_length:], np.float32)
        else:
            output = np.array(orjson.loads(reply)["outputs"][0]["data"], np.float32)
        if not np.array_equal(output, expected):
            raise SystemExit("a large request's answer differs from its input")
    return len(reply)


def cpu_pressure() -> float:
    """The share of the last 10 s in which some task waited for a CPU, in % (Linux PSI)."""
    try:
        first = Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except (OSError, IndexError):
        return float("nan")
    return float(first.split()[1].partition("=")[2])


def percentile(values: list[float], point: float) -> float:
    return float(np.percentile(values, point)) if values else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=float, default=60.0)
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--binary-output", action="store_true", help="ask for the output as binary data")
    parser.add_argument("--objects-to", metavar="PATH", help="send bodies of small objects to this endpoint")
    parser.add_argument("--name", default="large_json", help="the results file's name")
    parser.add_argument("--small-against", type=Path, help="another checkout: compare the small-body path")
    parser.add_argument("--trials", type=int, default=5, help="wrk trials per checkout (--small-against)")
    parser.add_argument("--seconds", type=float, default=5.0, help="each wrk trial (--small-against)")
    args = parser.parse_args()
    if args.small_against is not None:
        tables, data = compare_small_path(args)
        write_results("large_json", args, tables, data, name=f"{args.name}_small")
        return

    if args.objects_to:
        body, expected = objects_body(args.megabytes), np.zeros(0, np.float32)
        print(f"large body: {len(body) / 1e6:.1f} MB of small objects, to {args.objects_to}", flush=True)
    else:
        body, expected = large_body(args.megabytes, args.binary_output)
        print(f"large body: {len(body) / 1e6:.1f} MB, {expected.size:,} FP32 values", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        repository = Path(folder)
        write_model(repository, "identity", identity_onnx(), CONFIG)
        server = start_server(repository, "--model-control-mode=explicit", "--load-model=identity")
        try:
            tables, results = measure(server, args, body, expected)
        finally:
            server.close()
    write_results("large_json", args, tables, results, name=args.name)


def measure(
    server: ServerProcess, args: argparse.Namespace, body: bytes, expected: np.ndarray
) -> tuple[list[Table], dict[str, object]]:
    host, port_text = server.http_url.rsplit(":", 1)
    port = int(port_text)
    assert server.process is not None
    pid = server.process.pid
    for _ in range(20):  # warm-up: the small path's first calls
        connection = http.client.HTTPConnection(host, port, timeout=30)
        connection.request("POST", INFER, SMALL_BODY)
        connection.getresponse().read()
        connection.close()
    time.sleep(1.0)
    start_rss, start_tree = rss_mib(pid), tree_rss_mib(pid)

    pressure = [cpu_pressure()]
    ours, theirs = multiprocessing.get_context("spawn").Pipe()
    probe = multiprocessing.get_context("spawn").Process(target=probe_process, args=(host, port, theirs))
    probe.start()
    ours.recv()
    time.sleep(0.5)
    intervals: list[tuple[float, float]] = []
    after: list[tuple[float, float]] = []
    reply_size = 0
    with RssPeak(pid) as peak:
        for index in range(args.requests):
            started = time.monotonic()
            check = expected if index == 0 and not args.objects_to else None
            reply_size = send_large(host, port, body, check, args.binary_output, args.objects_to or INFER)
            intervals.append((started, time.monotonic()))
            after.append((rss_mib(pid), tree_rss_mib(pid)))
            pressure.append(cpu_pressure())
            print(
                f"  request {index + 1}: {intervals[-1][1] - started:.2f} s, "
                f"RSS {after[-1][0]:.0f} MiB (with workers {after[-1][1]:.0f})",
                flush=True,
            )
    ours.send("stop")
    samples: dict[str, list[tuple[float, float, str]]] = ours.recv()
    probe.join(30)
    time.sleep(2.0)
    end_rss, end_tree = rss_mib(pid), tree_rss_mib(pid)

    def during(start: float) -> bool:
        return any(begin <= start < end for begin, end in intervals)

    probes: dict[str, dict[str, float]] = {}
    for kind, found in samples.items():
        latencies = [seconds * 1000 for start, seconds, error in found if during(start) and not error]
        errors = [error for start, _, error in found if error]
        probes[kind] = {
            "count": len(latencies),
            "errors": len(errors),
            "p50_ms": percentile(latencies, 50),
            "p99_ms": percentile(latencies, 99),
            "max_ms": max(latencies, default=0.0),
        }
        if errors:
            print(f"  {kind} errors: {errors[:3]}")
    durations = [end - begin for begin, end in intervals]
    tables: list[Table] = []
    tables.append(
        print_table(
            f"Probes while a {len(body) / 1e6:.0f} MB JSON request is in progress ({args.requests} requests, "
            f"{'binary' if args.binary_output else 'JSON'} answers of {reply_size / 1e6:.0f} MB)",
            ["probe", "count", "errors", "p50 ms", "p99 ms", "max ms"],
            [
                [kind, f["count"], f["errors"], f["p50_ms"], f["p99_ms"], f["max_ms"]]
                for kind, f in probes.items()
            ],
        )
    )
    memory = {
        "start_mib": start_rss,
        "peak_mib": peak.peak,
        "end_mib": end_rss,
        "start_with_workers_mib": start_tree,
        "peak_with_workers_mib": peak.peak_tree,
        "end_with_workers_mib": end_tree,
    }
    tables.append(
        print_table(
            "Server memory (VmRSS, MiB)",
            ["", "start", "peak", "after the last request", "growth"],
            [
                ["server process", start_rss, peak.peak, end_rss, end_rss - start_rss],
                ["with its worker processes", start_tree, peak.peak_tree, end_tree, end_tree - start_tree],
            ],
        )
    )
    print(
        f"\nlarge request: median {np.median(durations):.2f} s, "
        f"min {min(durations):.2f} s, max {max(durations):.2f} s"
    )
    print(
        f"CPU pressure (PSI some, avg10) after each request: median {np.median(pressure):.0f}%, "
        f"max {max(pressure):.0f}% (0% on an idle machine)"
    )
    return tables, {
        "body_bytes": len(body),
        "reply_bytes": reply_size,
        "requests": args.requests,
        "binary_output": args.binary_output,
        "pythonpath": os.environ.get("PYTHONPATH", ""),
        "probes": probes,
        "memory": memory,
        "rss_after_each_request_mib": [{"server": server, "with_workers": tree} for server, tree in after],
        "cpu_pressure_percent": {"median": float(np.median(pressure)), "max": max(pressure)},
        "large_request_s": {
            "median": float(np.median(durations)),
            "min": min(durations),
            "max": max(durations),
        },
    }


def compare_small_path(args: argparse.Namespace) -> tuple[list[Table], dict[str, object]]:
    """wrk on a small JSON infer body against this checkout's server and another's, in turn."""
    other = args.small_against.resolve()
    paths = {
        "this checkout": os.environ.get("PYTHONPATH", ""),
        str(other): os.pathsep.join(str(other / part) for part in ("core", "plugins/onnx")),
    }
    loads: dict[str, list[Load]] = {name: [] for name in paths}
    with tempfile.TemporaryDirectory() as folder:
        repository = Path(folder)
        write_model(repository, "identity", identity_onnx(), CONFIG)
        servers = {}
        try:
            for name, pythonpath in paths.items():
                servers[name] = ServerProcess(
                    [repository],
                    ["--log-verbose=0", "--model-control-mode=explicit", "--load-model=identity"],
                    env={"PYTHONPATH": pythonpath},
                ).start(timeout=120)
            for server in servers.values():  # warm-up, not counted
                wrk(
                    f"http://{server.http_url}{INFER}",
                    8,
                    1.0,
                    SMALL_BODY,
                    {"Content-Type": "application/json"},
                )
            for trial in range(args.trials):
                for name in rotated(tuple(paths), trial):
                    url = f"http://{servers[name].http_url}{INFER}"
                    loads[name].append(
                        wrk(url, 8, args.seconds, SMALL_BODY, {"Content-Type": "application/json"})
                    )
                    print(
                        f"  trial {trial + 1}, {name}: {loads[name][-1].requests_per_s:,.0f} req/s",
                        flush=True,
                    )
        finally:
            for server in servers.values():
                server.close()
    medians = {name: median_load(found) for name, found in loads.items()}
    tables: list[Table] = []
    tables.append(
        print_table(
            f"Small JSON infer ({len(SMALL_BODY)} bytes), wrk 8 connections, median of {args.trials} trials",
            ["checkout", "req/s", "p50 ms", "p99 ms", "errors"],
            [
                [name, load.requests_per_s, load.p50_ms, load.p99_ms, load.errors]
                for name, load in medians.items()
            ],
        )
    )
    return tables, {"small_body_bytes": len(SMALL_BODY), "trials": loads, "medians": medians}


if __name__ == "__main__":
    main()
