"""The `coreserve` command. Flags are spelled as tritonserver's where they mean the same.

coreserve --model-repository DIR [--http-port 8000] [--exit-on-error BOOL] ...
coreserve backends
coreserve new-backend NAME [--directory DIR]
coreserve analyze --model-repository DIR --model NAME [--latency-budget-ms MS] [--output-dir DIR]
coreserve traffic MODEL [--weights 1=90,2=10] [--shadow 3=100] [--clear]
coreserve rollout start|status|promote|abort MODEL [...]
coreserve NAME ...   (a command a plugin adds, e.g. plugin-python's `coreserve python-envs list`)
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from coreserve import InvalidArgumentError
from coreserve.cli._flags import parse_serve_args
from coreserve.cli._options import cache_config, server_options
from coreserve.cli._triton_flags import accepted_flags_warning

T = TypeVar("T")


def _run_server(argv: Sequence[str]) -> int:
    from coreserve.server import ServerRuntime, StartupError
    from coreserve.server.log_settings import ServerLog, StartupLogError
    from coreserve.server.workers import Supervisor, WorkerRole

    args = parse_serve_args(argv)
    logger = logging.getLogger("coreserve")
    try:
        options = server_options(args)
        log = ServerLog(options.log_settings)
        log.install()
    except (InvalidArgumentError, StartupLogError) as exc:
        print(f"coreserve: error: {exc}", file=sys.stderr)
        return 1
    warning = accepted_flags_warning(args)
    if warning:
        logger.warning("%s", warning)
    _warn_cache_flags(args, logger)
    _warn_strict_model_config(args)
    if args.rate_limit_resource and args.rate_limit == "off":
        logger.warning("--rate-limit-resource has no effect under --rate-limit=off")
    role = WorkerRole.from_environment()
    workers = max(options.http_workers, options.grpc_workers)
    if role is None and workers > 1:
        return _event_loop_runner()(Supervisor(argv, options).run())
    try:  # the constructor refuses a repository URL that names no storage it can read
        server = ServerRuntime(options, log=log, worker=role)
    except StartupError as exc:
        logger.error("%s", exc.message)
        return 1
    try:
        _event_loop_runner()(server.serve())
    except StartupError:  # serve() said why
        return 1
    return 0 if server.stopped_in_time else 1  # as Triton: an exit timeout that cut work is a failure


def _warn_cache_flags(args: argparse.Namespace, logger: logging.Logger) -> None:
    from coreserve.scheduling.cache.config import check_cache_config

    not_built = check_cache_config(cache_config(args))
    if not_built:
        logger.warning("%s", not_built)
    if args.response_cache_byte_size is not None:  # as Triton warns
        logger.warning(
            "'--response-cache-byte-size' is deprecated; it means --cache-config=local,size=%d",
            args.response_cache_byte_size,
        )


def _warn_strict_model_config(args: argparse.Namespace) -> None:
    """Triton's two lines on its deprecated flag, on standard error as it writes them (not as log
    entries: its QA looks for them on the console whatever the log file)."""
    if args.strict_model_config is None:
        return
    print(
        "Warning: '--strict-model-config' has been deprecated! Please use "
        "'--disable-auto-complete-config' instead.",
        file=sys.stderr,
    )
    if args.disable_auto_complete_config and not args.strict_model_config:
        print(
            "Warning: Overriding deprecated '--strict-model-config' from False to True in favor of "
            "'--disable-auto-complete-config'!",
            file=sys.stderr,
        )


def _event_loop_runner() -> Callable[[Coroutine[Any, Any, T]], T]:
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return uvloop.run


def _list_backends() -> int:
    from coreserve.backend.plugins.manager import Plugins

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    plugins = Plugins()
    rows = [("BACKEND", "PLATFORMS", "DISTRIBUTION", "VERSION")]
    for backend in sorted(plugins.backends(), key=lambda b: b.name):
        origin = plugins.origin(backend)
        rows.append((backend.name, ",".join(backend.platforms) or "-", origin.distribution, origin.version))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    if len(rows) == 1:
        print("(no backends installed: pip install plugin-onnx, for example)")
    for failure in plugins.failures:
        print(f"failed to load: plugin '{failure.entry_point}' from {failure.distribution}: {failure.error}")
    return 0


def _ray(argv: Sequence[str]) -> int:
    """`coreserve ray …` (`_ray`, over coreserve.ray), or one line saying which extra it needs."""
    try:
        from coreserve.cli._ray import main as ray_main
    except ImportError as exc:
        if (exc.name or "").split(".")[0] not in ("ray", "starlette"):
            raise
        print(
            f"coreserve: error: 'coreserve ray' needs Ray Serve: pip install 'core-server[ray]' ({exc})",
            file=sys.stderr,
        )
        return 1
    return ray_main(argv)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["backends"]:
        return _list_backends()
    if arguments[:1] == ["ray"]:
        return _ray(arguments[1:])
    if arguments[:1] == ["analyze"]:
        from coreserve.analyze import main as analyze

        return analyze(arguments[1:])
    if arguments[:1] in (["traffic"], ["rollout"]):
        from coreserve.cli._traffic import rollout_main, traffic_main

        return (traffic_main if arguments[0] == "traffic" else rollout_main)(arguments[1:])
    if arguments[:1] == ["new-backend"]:
        from coreserve.cli.new_backend import main as new_backend

        return new_backend(arguments[1:])
    if arguments and not arguments[0].startswith("-"):
        from coreserve.backend.plugins.manager import Plugins

        command = Plugins().commands().get(arguments[0])
        if command is not None:
            return command.main(arguments[1:])
    return _run_server(arguments)
