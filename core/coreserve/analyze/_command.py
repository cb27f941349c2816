"""`coreserve analyze`: start (or reach) a server, sweep the model, write what was found.

    coreserve analyze --model-repository DIR --model NAME [--latency-budget-ms 20]
        [--search quick|brute] [--output-dir analysis/]

Writes OUTPUT_DIR/report.html, results/*.csv and output_model_repository/, prints the best
configurations, and keeps every measurement in checkpoint.jsonl: the same command resumes an
interrupted analysis.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from coreserve.analyze._analysis import Analysis
from coreserve.analyze._flags import parse_args
from coreserve.analyze._points import CPU, GPU, ModelSettings
from coreserve.analyze._ranking import Constraints
from coreserve.analyze.measure._client import ServerClient, ServerGone
from coreserve.analyze.measure._found import AnalyzeError, ModelAsFound, find_model
from coreserve.analyze.measure._gpu_metrics import GpuMetrics
from coreserve.analyze.measure._load import Windows
from coreserve.analyze.measure._server_process import ServerProcess, Usage, tree_usage
from coreserve.analyze.report._csv_files import write_csv_files
from coreserve.analyze.report._html import write_report
from coreserve.analyze.report._output_repository import OUTPUT_REPOSITORY, write_output_repository
from coreserve.analyze.report._terminal_table import best_table
from coreserve.analyze.search._checkpoint import Checkpoint, CheckpointMismatch
from coreserve.analyze.search._progress import Progress
from coreserve.analyze.search._strategy import SearchSpace, brute, quick
from coreserve.analyze.search._sweep import Sweep
from coreserve.errors import UnsupportedError

READY_WITHIN_S = 120.0


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        return asyncio.run(_analyze(args))
    except AnalyzeError as exc:
        print(f"coreserve analyze: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("coreserve analyze: interrupted; the same command resumes it", file=sys.stderr)
        return 130


def _measured_what(args: argparse.Namespace) -> dict[str, str]:
    """What the checkpoint's measurements are of: a resumed analysis must measure the same."""
    server = args.server_url or f"started on {Path(args.model_repository).resolve()}"
    generator = "perf_analyzer" if args.perf_analyzer else "coreserve analyze"
    return {"model": args.model, "server": server, "load": f"{args.protocol} by {generator}"}


def _model_dir(args: argparse.Namespace) -> Path | None:
    if args.model_repository is None:
        return None
    repository = Path(args.model_repository)
    if not repository.is_dir():
        raise AnalyzeError(f"--model-repository {repository} is not a folder")
    model_dir: Path = repository / args.model
    if not model_dir.is_dir():
        names = sorted(path.name for path in repository.iterdir() if path.is_dir())
        raise AnalyzeError(f"no model {args.model!r} in {repository} (it has: {', '.join(names) or 'none'})")
    return model_dir


async def _analyze(args: argparse.Namespace) -> int:
    model_dir = _model_dir(args)
    args.perf_analyzer = _perf_analyzer(args.perf_analyzer)  # refused before any server starts
    out_dir: Path = args.output_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        checkpoint = Checkpoint(out_dir, _measured_what(args))
    except CheckpointMismatch as exc:
        raise AnalyzeError(str(exc)) from None
    constraints = Constraints(
        args.latency_budget_ms, args.min_throughput, args.max_memory_mb, args.max_gpu_memory_mb
    )
    server = None
    if not args.server_url:
        server = ServerProcess(args.model_repository, out_dir / "server.log", args.server_arg)
    client = ServerClient(server.address if server is not None else args.server_url)
    gpus = None
    try:
        await _wait_ready(client, server)
        gpus = await _gpu_metrics(args, server)
        found = await find_model(client, args.model, args.composing_models, load=server is not None)
        await _search(args, client, server, found, constraints, checkpoint, gpus)
    except ServerGone as exc:
        log = f"\n{server.log_tail()}" if server is not None else ""
        raise AnalyzeError(
            f"{exc}; what was measured is kept: the same command resumes the analysis{log}"
        ) from None
    finally:
        if gpus is not None:
            await gpus.close()
        await client.close()
        if server is not None:
            server.stop()
    analysis = Analysis(
        args.model,
        model_dir,
        found.config,
        constraints,
        args.objective,
        checkpoint.measurements(),
        composing_configs=found.composing,
    )
    _write_outputs(analysis, out_dir, args.top)
    return 0


async def _wait_ready(client: ServerClient, server: ServerProcess | None) -> None:
    deadline = time.monotonic() + READY_WITHIN_S
    while not await client.ready():
        if server is not None and not server.alive():
            raise AnalyzeError(f"the server did not start:\n{server.log_tail()}")
        if time.monotonic() > deadline:
            raise AnalyzeError(f"the server at {client.address} was not ready within {READY_WITHIN_S:.0f} s")
        await asyncio.sleep(0.2)


async def _gpu_metrics(args: argparse.Namespace, server: ServerProcess | None) -> GpuMetrics | None:
    """The server's GPUs, read from its metrics while the analysis runs; None where it reports
    none (then asking for GPU instances or a GPU memory bound is an error)."""
    if server is not None:
        url = server.metrics_url
    else:
        url = args.metrics_url or f"http://{args.server_url.rsplit(':', 1)[0]}:8002/metrics"
    gpus, reason = await GpuMetrics.open(url)
    if gpus is not None:
        print(f"coreserve analyze: GPU memory and utilisation read from {url}: {reason}", file=sys.stderr)
        return gpus
    asked = [
        flag
        for flag, given in (
            ("--instance-kinds gpu", args.instance_kinds and GPU in args.instance_kinds),
            ("--max-gpu-memory-mb", args.max_gpu_memory_mb is not None),
        )
        if given
    ]
    if asked:
        raise AnalyzeError(f"{' and '.join(asked)}: no GPU to measure ({reason})")
    return None


async def _search(
    args: argparse.Namespace,
    client: ServerClient,
    server: ServerProcess | None,
    found: ModelAsFound,
    constraints: Constraints,
    checkpoint: Checkpoint,
    gpus: GpuMetrics | None,
) -> None:
    base_config = found.config
    own_settings = base_config.platform != "ensemble"
    kinds = args.instance_kinds or ((CPU, GPU) if gpus is not None else ())
    space = SearchSpace(
        max_batch_size=args.max_batch_size,
        max_instance_count=args.max_instance_count,
        queue_delays_us=args.queue_delays_us,
        max_concurrency=args.max_concurrency,
        batching=base_config.max_batch_size > 0,
        own_settings=own_settings,
        composing=tuple(found.composing),
        instance_kinds=kinds if own_settings else (),
    )
    baseline = ModelSettings.of(base_config, found.composing)
    everything = space.all_settings(baseline)
    total: int | None = 1  # a server we did not start: its configuration as it is
    if server is not None:  # brute's count is known ahead, quick's path is not
        total = len(everything) + (baseline not in everything) if args.search == "brute" else None
    progress = Progress(total)
    usage: Callable[[], Usage] | None = None
    if server is not None:
        pid = server.process.pid
        usage = lambda: tree_usage(pid)  # noqa: E731
    sweep = Sweep(
        client,
        args.model,
        base_config,
        space,
        constraints,
        Windows(seconds=args.window_seconds, max_windows=args.max_windows),
        checkpoint,
        progress,
        usage,
        reconfigure=server is not None,
        composing_configs=found.composing,
        http_address=_http_address(args, server),
        perf_analyzer=args.perf_analyzer,
        gpus=gpus,
    )
    try:
        await sweep.evaluate(baseline)  # the model as it is: what the report compares against
        if server is None:
            return
        if args.search == "brute":
            await brute(space, baseline, sweep.evaluate)
        else:
            await quick(space, baseline, sweep.evaluate, constraints, args.objective, progress.expect)
    finally:
        await sweep.close()


def _perf_analyzer(asked: str | None) -> str | None:
    """The perf_analyzer binary asked for, found on PATH or as a path; None: not asked for."""
    if asked is None:
        return None
    found = shutil.which(asked)
    if found is None:
        raise AnalyzeError(
            f"--perf-analyzer: {asked!r} is not an executable found on PATH or at that path "
            "(perf_analyzer ships in the tritonclient wheel)"
        )
    return found


def _http_address(args: argparse.Namespace, server: ServerProcess | None) -> str | None:
    """Where HTTP load goes, for --protocol http; None: the load goes over gRPC."""
    if args.protocol != "http":
        return None
    return server.http_address if server is not None else str(args.http_url)


def _write_outputs(analysis: Analysis, out_dir: Path, top: int) -> None:
    written = [*write_csv_files(analysis, out_dir)]
    if write_output_repository(analysis, out_dir, top):
        written.append(out_dir / OUTPUT_REPOSITORY)
    try:
        written.append(write_report(analysis, out_dir, top))
    except UnsupportedError as exc:  # plotly is an extra: the rest of the outputs stand
        print(f"coreserve analyze: {exc}", file=sys.stderr)
    print(best_table(analysis, top))
    print("\nwritten: " + ", ".join(str(path) for path in written))
