"""`coreserve analyze`'s flags, named as Model Analyzer's options where they mean the same."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path


def _positive(kind: type[int] | type[float]) -> argparse._ActionType:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"expected a number above 0, got {text!r}")
        return value

    return parse


def _delays(text: str) -> tuple[int, ...]:
    try:
        values = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected microseconds separated by commas, got {text!r}") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected one or more delays of 0 or more, got {text!r}")
    return values


def _names(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if not names:
        raise argparse.ArgumentTypeError(f"expected model names separated by commas, got {text!r}")
    return names


def _kinds(text: str) -> tuple[str, ...]:
    names = [part.strip().lower() for part in text.split(",") if part.strip()]
    if not names or any(name not in ("cpu", "gpu") for name in names):
        raise argparse.ArgumentTypeError(f"expected cpu, gpu or cpu,gpu, got {text!r}")
    return tuple(f"KIND_{name.upper()}" for name in ("cpu", "gpu") if name in names)


def parser() -> argparse.ArgumentParser:
    flags = argparse.ArgumentParser(
        prog="coreserve analyze",
        description="Find the model configuration and client load that serve best within your "
        "constraints, and write a report (Triton's Model Analyzer).",
    )
    where = flags.add_argument_group("what to measure")
    where.add_argument(
        "--model-repository", type=Path, help="the repository to serve (a coreserve is started)"
    )
    where.add_argument("--model", required=True, help="the model to analyze")
    where.add_argument(
        "--server-url",
        help="measure a server already running (coreserve or Triton) at HOST:PORT of its gRPC "
        "endpoint: only the client load is swept (with --model-repository too, the output "
        "repository is written from the model's files there)",
    )
    where.add_argument(
        "--composing-models",
        type=_names,
        default=(),
        metavar="A,B",
        help="the models a BLS model calls: their instance counts are swept with it (an "
        "ensemble's steps are found in its configuration)",
    )
    where.add_argument(
        "--protocol",
        choices=("grpc", "http"),
        default="grpc",
        help="how the load generator sends requests (perf_analyzer's -i); control calls use gRPC",
    )
    where.add_argument(
        "--http-url",
        metavar="HOST:PORT",
        help="the HTTP endpoint of the --server-url server, for --protocol http",
    )
    where.add_argument(
        "--perf-analyzer",
        nargs="?",
        const="perf_analyzer",
        metavar="PATH",
        help="measure with Triton's perf_analyzer (the one on PATH, or PATH) instead of coreserve's "
        "own load generator",
    )
    where.add_argument(
        "--metrics-url",
        metavar="URL",
        help="the --server-url server's Prometheus metrics, where its GPUs' memory and utilisation "
        "are read (Model Analyzer's --triton-metrics-url; default: port 8002 of its host)",
    )
    where.add_argument("--output-dir", type=Path, default=Path("analysis"), help="(default: analysis)")
    where.add_argument(
        "--server-arg",
        action="append",
        default=[],
        metavar="FLAG",
        help="a flag for the coreserve the analysis starts (repeat it), e.g. --server-arg=--log-verbose=1",
    )
    goals = flags.add_argument_group("constraints and objective")
    goals.add_argument("--latency-budget-ms", type=_positive(float), help="p99 latency at most this")
    goals.add_argument("--min-throughput", type=_positive(float), help="inferences per second at least this")
    goals.add_argument("--max-memory-mb", type=_positive(float), help="server memory (RSS) at most this")
    goals.add_argument(
        "--max-gpu-memory-mb", type=_positive(float), help="GPU memory used (all GPUs) at most this"
    )
    goals.add_argument("--objective", choices=("throughput", "latency"), default="throughput")
    search = flags.add_argument_group("the search")
    search.add_argument("--search", choices=("quick", "brute"), default="quick")
    search.add_argument(
        "--max-batch-size", type=_positive(int), default=16, help="largest max_batch_size tried"
    )
    search.add_argument("--max-instance-count", type=_positive(int), default=4)
    search.add_argument(
        "--queue-delays-us",
        type=_delays,
        default=(0,),
        help="max_queue_delay_microseconds values tried with dynamic batching (default: 0)",
    )
    search.add_argument(
        "--instance-kinds",
        type=_kinds,
        metavar="cpu,gpu",
        help="the instance kinds tried (default: both where the server reports GPUs, else the model's own)",
    )
    search.add_argument("--max-concurrency", type=_positive(int), default=64)
    search.add_argument("--window-seconds", type=_positive(float), default=1.0, help="one measurement window")
    search.add_argument(
        "--max-windows", type=_positive(int), default=10, help="windows per load level at most"
    )
    search.add_argument("--top", type=_positive(int), default=3, help="configurations kept in the output")
    return flags


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    flags = parser()
    args = flags.parse_args(argv)
    if args.model_repository is None and args.server_url is None:
        flags.error("give --model-repository (a server is started), --server-url, or both")
    if args.protocol == "http" and args.server_url and not args.http_url:
        flags.error("--protocol http with --server-url needs --http-url (the server's HTTP endpoint)")
    if args.max_memory_mb is not None and args.server_url:
        flags.error(
            "--max-memory-mb needs a server the analysis starts (its memory is read from its processes)"
        )
    if args.metrics_url and not args.server_url:
        flags.error("--metrics-url is for --server-url (the server the analysis starts is read directly)")
    if args.max_windows < 3:
        flags.error("--max-windows must be at least 3 (the stability rule compares three windows)")
    return args
