"""HTTP/2 attacks on coreserve's gRPC port, and what they cost the other clients.

    python -m benchmarks.attacks.http2_attacks [--grpc-server native|grpcio ...] [--seconds 10]
        [--attacks hpack-bomb,rapid-reset,...] [--dynamic-batching] [SERVER FLAGS ...]
    python -m benchmarks.attacks.http2_attacks --server-url HOST:GRPC_PORT --http-url HOST:HTTP_PORT
        [--server-pid PID]

By default it starts one coreserve process per `--grpc-server` (both, native first) on free
ports of 127.0.0.1, serving an ONNX identity model (`identity`, FP32 [-1, 16], with dynamic
batching under `--dynamic-batching`); flags it does not know go to the server. `--server-url`
attacks a server that is already running instead (it must serve that model; `--server-pid`
lets the script read its memory and CPU).

Each phase runs for `--seconds` (or until its count runs out): first two controls, a baseline
without attack and `cpu-control` (the attacker only keeps a core busy: what the other client loses
to an attacker's CPU on the same machine, whatever it sends), then each attack with raw frames
written by hand over its own sockets (http2_wire.py; the attacks are in http2_attackers.py):

- hpack-bomb: header blocks of about 64 KiB that index one 4 KB dynamic-table entry 65,000 times
  each (about 260 MB once decoded), one per stream, a new connection when the server closes one;
- rapid-reset (CVE-2023-44487): HEADERS + DATA (a valid ModelInfer) + RST_STREAM per stream, as
  fast as the server reads, reconnecting after each GOAWAY or close (`--connections` at once);
- continuation-flood: a HEADERS frame, then empty CONTINUATION frames that never end the block;
- ping-flood: one streaming call open, then PING frames, not reading the acknowledgements;
- settings-flood: empty SETTINGS frames, not reading the acknowledgements;
- settings-window: 1,000 open calls, then SETTINGS frames that change SETTINGS_INITIAL_WINDOW_SIZE
  (each change moves every open stream's window), not reading;
- gzip-bomb: ModelInfer calls whose gzip message (about 306 KB) inflates to 300 MiB, one at a time;
- bad-gzip: a valid request compressed with gzip and deflate, and broken: gzip without its CRC
  trailer, gzip followed by garbage, deflate without its Adler-32 trailer (the status of each).

Every loop is bounded by the phase's time and a count (`--max-*`), and a phase stops early when
the server's memory grows past `--max-server-rss-mb`. While it runs, a second client
(tritonclient.grpc, one infer of a [1, 16] tensor at a time, 10 s timeout) counts its calls,
errors by status code and latencies, an HTTP probe GETs /v2/health/ready every 50 ms (both in a
process of their own, see attack_watch.py), and the server's resident memory with its child
processes is sampled every 100 ms. Prints two tables per server (the others' view, the attacker's)
and writes benchmarks/results/http2_attacks.json. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.attacks.attack_watch import MODEL, WIDTH, MemorySampler, Target, Victims, tree_rss_mb
from benchmarks.attacks.http2_attackers import ATTACKS, CONTROLS, Attacker, Budget
from benchmarks.support.cpu_time import tree_cpu_seconds
from benchmarks.support.models import identity_onnx, start_server, write_model
from benchmarks.support.reporting import Table, print_table, write_results

CONFIG = f"""
backend: "onnxruntime"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {WIDTH} ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {WIDTH} ] }} ]
"""
BATCHING = "dynamic_batching { max_queue_delay_microseconds: 2000 }\n"


# ---------------------------------------------------------------- phases and servers


def run_phase(name: str, target: Target, args: argparse.Namespace) -> dict[str, Any]:
    """One attack (or the baseline) with the other client, the probe and the sampler around it."""
    pid = target.pid
    memory = MemorySampler(pid, args.max_server_rss_mb) if pid else None
    victims = Victims(target)
    rss_before = tree_rss_mb(pid) if pid else None
    cpu_before = tree_cpu_seconds(pid) if pid else 0.0
    own_cpu_before = time.process_time()
    if memory is not None:
        memory.start()
    attacker = Attacker(target)
    started = time.monotonic()
    budget = Budget(started + args.seconds, memory.over if memory else threading.Event())
    try:
        {**CONTROLS, **ATTACKS}[name](attacker, budget, args)
    finally:
        attacker_view = attacker.summary()
        attacker.close()
    seen = victims.results()
    wall = time.monotonic() - started
    attacker_view["attacker_cpu_cores"] = round((time.process_time() - own_cpu_before) / wall, 2)
    alive = pid is None or Path(f"/proc/{pid}").exists()
    cpu = (tree_cpu_seconds(pid) - cpu_before) / wall if pid and alive else None
    time.sleep(args.settle_seconds)  # what the server still holds once the attack is over
    if memory is not None:
        memory.stop()
    return {
        "phase": name,
        "seconds": round(wall, 1),
        **seen,
        "server": {
            "alive": alive,
            "rss_mb_before": rss_before,
            "rss_mb_peak": memory.peak_mb if memory else None,
            "rss_mb_after": tree_rss_mb(pid) if pid and alive else None,
            "stopped_at_memory_limit": bool(memory and memory.over.is_set()),
            "cpu_cores": cpu,
        },
        "attacker": attacker_view,
    }


def counts(counter: dict[str, int]) -> str:
    return " ".join(f"{key}:{value}" for key, value in counter.items()) or "-"


def print_server(label: str, phases: list[dict[str, Any]]) -> list[Table]:
    """Prints the two tables of one server's phases (the others' view, the attacker's); returns them."""
    base_p99 = phases[0]["client"]["p99_ms"] if phases and phases[0]["phase"] == "baseline" else None
    rows = []
    for phase in phases:
        client, health, server = phase["client"], phase["health"], phase["server"]
        memory = "-"
        if server["rss_mb_before"] is not None:
            memory = (
                f"{server['rss_mb_before']:.0f}/{server['rss_mb_peak']:.0f}/{server['rss_mb_after'] or 0:.0f}"
            )
            memory += " (limit)" if server["stopped_at_memory_limit"] else ""
        rows.append([
            phase["phase"], phase["seconds"], client["calls"], counts(client["errors"]), client["p50_ms"], client["p99_ms"],
            client["max_ms"], client["p99_ms"] / base_p99 if base_p99 else "-", health["p99_ms"], health["max_ms"],
            counts(health["failures"]), memory, server["cpu_cores"] if server["cpu_cores"] is not None else "-",
        ])  # fmt: skip
    tables: list[Table] = []
    tables.append(print_table(
        f"{label}: the other client, the HTTP probe and the server",
        ["phase", "s", "calls", "errors", "p50 ms", "p99 ms", "max ms", "p99/base", "health p99", "health max",
         "health fails", "RSS MB before/peak/after", "CPU cores"],
        rows,
    ))  # fmt: skip
    rows = []
    for phase in [phase for phase in phases if phase["phase"] not in CONTROLS]:
        view = phase["attacker"]
        rows.append([
            phase["phase"], counts(view["sent"]), view["sent_mb"], view["connections"], counts(view["closed_by_server"]),
            counts(view["goaways"]), counts(view["rst_stream"]), view["send_blocked_s"],
        ])  # fmt: skip
    tables.append(
        print_table(
            f"{label}: what the attacker sent and got back",
            [
                "phase",
                "sent",
                "MB",
                "connections",
                "closed by server",
                "GOAWAY",
                "RST_STREAM",
                "send blocked s",
            ],
            rows,
        )
    )
    for phase in phases:
        if "answers" in phase["attacker"]:
            print(f"  {phase['phase']} answers: {phase['attacker']['answers']}")
        elif phase["attacker"].get("tracked_streams"):
            print(f"  {phase['phase']} answers: {phase['attacker']['tracked_streams']}")
        if phase["client"]["error_examples"]:
            print(f"  {phase['phase']} client errors: {phase['client']['error_examples']}")
    return tables


def attack_server(label: str, target: Target, args: argparse.Namespace,
                  restart: Callable[[], Target] | None) -> list[dict[str, Any]]:  # fmt: skip
    """The baseline and every attack on one server; a server that died is started again."""
    phases = []
    for name in [*CONTROLS, *args.attacks]:
        print(f"{label}: {name} ...", flush=True)
        phase = run_phase(name, target, args)
        phases.append(phase)
        if not phase["server"]["alive"]:
            print(f"{label}: the server died during {name}", flush=True)
            if restart is None:
                break
            target = restart()
    return phases


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--grpc-server",
        action="append",
        choices=["native", "grpcio"],
        help="the transport(s) to attack (default: native, then grpcio)",
    )
    parser.add_argument(
        "--attacks", default=",".join(ATTACKS), help="comma-separated, from: " + ", ".join(ATTACKS)
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    parser.add_argument("--settle-seconds", type=float, default=2.0, help="pause after each phase")
    parser.add_argument("--dynamic-batching", action="store_true", help="the model batches dynamically")
    parser.add_argument("--server-url", help="attack this running server's gRPC HOST:PORT instead")
    parser.add_argument("--http-url", help="with --server-url: its HTTP HOST:PORT (for the probe)")
    parser.add_argument("--server-pid", type=int, help="with --server-url: its process, for memory and CPU")
    parser.add_argument("--max-server-rss-mb", type=float, default=4096, help="a phase stops past this")
    parser.add_argument("--max-bombs", type=int, default=2000, help="hpack-bomb: header blocks at most")
    parser.add_argument("--max-streams", type=int, default=2_000_000, help="rapid-reset: streams at most")
    parser.add_argument("--connections", type=int, default=1, help="rapid-reset: connections side by side")
    parser.add_argument(
        "--max-frames", type=int, default=10_000_000, help="continuation-flood: frames at most"
    )
    parser.add_argument(
        "--max-control-frames", type=int, default=2_000_000, help="ping/settings floods: at most"
    )
    parser.add_argument("--open-calls", type=int, default=1000, help="settings-window: calls held open")
    parser.add_argument(
        "--window-changes", type=int, default=100_000, help="settings-window: changes at most"
    )
    parser.add_argument("--max-calls", type=int, default=200, help="gzip-bomb, bad-gzip: calls at most")
    parser.add_argument("--name", default="http2_attacks", help="results file: benchmarks/results/NAME.json")
    args, server_flags = parser.parse_known_args()
    args.attacks = [name for name in args.attacks.split(",") if name]
    unknown = [name for name in args.attacks if name not in ATTACKS]
    if unknown:
        parser.error(f"unknown attacks: {unknown}")

    results: dict[str, Any] = {"seconds": args.seconds, "attacks": args.attacks, "servers": {}}
    tables: list[Table] = []
    if args.server_url:
        if not args.http_url:
            parser.error("--server-url needs --http-url")
        target = Target(args.server_url, args.http_url, args.server_pid)
        phases = attack_server(args.server_url, target, args, None)
        tables += print_server(args.server_url, phases)
        results["servers"][args.server_url] = phases
    else:
        repository = Path(tempfile.mkdtemp(prefix="coreserve-http2-attacks-"))
        write_model(
            repository,
            MODEL,
            identity_onnx(("batch", WIDTH)),
            CONFIG + (BATCHING if args.dynamic_batching else ""),
        )
        results["server_flags"] = server_flags
        results["dynamic_batching"] = args.dynamic_batching
        for kind in args.grpc_server or ["native", "grpcio"]:
            servers: list[Any] = []

            def start(kind: str = kind, servers: list[Any] = servers) -> Target:
                server = start_server(repository, f"--grpc-server={kind}", *server_flags)
                servers.append(server)
                assert server.process is not None
                return Target(server.grpc_url, server.http_url, server.process.pid)

            try:
                phases = attack_server(kind, start(), args, start)
            finally:
                tracebacks = sum(server.log.count("Traceback") for server in servers)
                for server in servers:
                    server.close()
            tables += print_server(f"--grpc-server {kind}", phases)
            print(f"  tracebacks in the server log: {tracebacks}")
            results["servers"][kind] = {"phases": phases, "tracebacks_in_log": tracebacks}
    parameters = {**vars(args), "server_flags": server_flags}
    print(f"\nwrote {write_results('http2_attacks', parameters, tables, results, name=args.name)}")


if __name__ == "__main__":
    main()
