"""The serving command's flags: their definitions, spellings and defaults, and the checks across them."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from coreserve.backend.python_based import DEFAULT_BACKEND_DIRECTORY
from coreserve.cli._options import cache_config
from coreserve.cli._tls import add_http_tls_flags, check_http_tls_flags
from coreserve.cli._triton_flags import add_accepted_flags, parse_bool, refuse_unknown
from coreserve.cli._values import (
    METRICS_SETTINGS,
    backend_config,
    cache_setting,
    header_pattern,
    interval_ms,
    memory_budget,
    metrics_config,
    non_negative_int,
    positive_int,
    positive_secs,
    protocol_restriction,
    rate_limit_resource,
    restriction,
    stream_limit,
)
from coreserve.repository.manager import ControlMode
from coreserve.repository.memory.budgets import MemoryBudgetError, parse_memory_budgets
from coreserve.server.grpc import DEFAULT_HANDSHAKE_TIMEOUT_S
from coreserve.version import __version__

GRPC_SERVERS = ("native", "grpcio")  # --grpc-server


def serve_parser() -> argparse.ArgumentParser:
    """The serving command's parser, every flag defined with its default."""
    parser = argparse.ArgumentParser(
        prog="coreserve",
        usage="coreserve --model-repository DIR [flag ...]   (coreserve --help lists them)",
        description="Serve the models of Triton-style model repositories over KServe v2 HTTP and gRPC.",
        epilog="Run `coreserve backends` to list the installed backends, "
        "`coreserve new-backend NAME` to write a new one.",
    )
    flag = parser.add_argument

    # fmt: off
    def bool_flag(name: str, default: bool | None, help: str | None = None) -> None:
        # Accepts --flag, --flag=false and --flag false, as tritonserver does.
        flag(name, type=parse_bool, nargs="?", const=True, default=default, metavar="BOOL", help=help)

    flag("--version", action="version", version=f"coreserve {__version__}")
    flag("--id", dest="server_id", default="coreserve",
         help="the name server metadata gives (default coreserve)")
    flag("--model-repository", "--model-store", dest="model_repositories", action="append", required=True,
         metavar="DIR_OR_URL", help="a model repository: a folder, or s3://… gs://… (repeatable)")
    flag("--model-control-mode", type=str.lower, choices=[mode.value for mode in ControlMode], default="none",
         help="none: load everything at start-up; poll: also apply repository changes; "
              "explicit: load what --load-model names, then what the repository API asks")
    flag("--load-model", dest="load_models", action="append", default=[], metavar="NAME",
         help="a model to load at start-up in explicit mode (repeatable; * for all)")
    bool_flag("--model-load-on-demand", False, "in explicit mode, a request for a model of the repository "
              "that is not loaded loads it and is answered when it is ready (default false)")
    flag("--model-memory-budget", type=memory_budget, action="append", default=None,
         metavar="BYTES|PERCENT|gpu:<id>=BYTES|PERCENT",
         help="in explicit mode, the host memory the loaded models may use (e.g. 2GB, 512MiB, 40%%), or "
              "a GPU's (gpu:0=8GB, gpu:0=60%%, read through NVML; repeatable, once per GPU): a load that "
              "would pass it first unloads the least recently used idle models that are not pinned "
              "(default: no budget)")
    flag("--repository-poll-secs", type=float, default=15.0,
         help="seconds between scans in poll mode (0 or less: none, as in Triton)")
    flag("--model-load-thread-count", type=int, default=4, help="models that load at the same time")
    flag("--model-load-retry-count", type=non_negative_int, default=0, metavar="N",
         help="times a version that fails to load is loaded again at once (default 0)")
    flag("--model-config-name", default="", metavar="NAME",
         help="load a model's configs/NAME.pbtxt where it has one, else its config.pbtxt")
    bool_flag("--model-namespacing", False, "let models of the same name live in different repositories; "
              "a request names one only if one repository has it (default false)")
    flag("--model-cache-dir", type=Path, default=None,
         help="where remote models and models loaded from files are kept; kept at exit (default: a new "
              "temporary folder of this server's own, coreserve-cache-* in the system temp folder, "
              "removed at exit)")
    for service, port in (("http", 8000), ("grpc", 8001), ("metrics", 8002)):
        bool_flag(f"--allow-{service}", True, f"serve {service} (default true)")
        if service == "metrics":  # as tritonserver: the HTTP address unless told otherwise
            flag("--metrics-address", default=None, help="address the metrics service binds (default: "
                 "--http-address's)")
        else:
            flag(f"--{service}-address", default="0.0.0.0", help=f"address the {service} service binds")
        flag(f"--{service}-port", type=int, default=port, help=f"port (default {port}; 0: any free one)")
    bool_flag("--reuse-http-port", False, "let other servers bind the same HTTP port (default false)")
    flag("--http-thread-count", type=positive_int, default=1, metavar="N",
         help="worker processes serving HTTP, each a whole server on the same ports with its own copy of "
              "the models, one server to the clients (default 1: one process)")
    flag("--grpc-infer-thread-count", type=positive_int, default=1, metavar="N",
         help="worker processes serving gRPC, as --http-thread-count (default 1)")
    flag("--worker-heartbeat-timeout-secs", type=positive_secs, default=5.0, metavar="S",
         help="with several workers: a worker that has not answered the supervisor for this long is hung, "
              "and is killed and started again (default 5)")
    flag("--openai-port", type=int, default=None, metavar="PORT",
         help="serve the OpenAI-compatible API (/v1/models, /v1/completions, /v1/chat/completions, "
              "/v1/embeddings) on this port; needs core-server[openai] "
              "(default: not served; 0: any free one)")
    flag("--openai-address", default=None,
         help="address the OpenAI frontend binds (default: --http-address's)")
    flag("--http-max-input-size", type=int, default=64 * 1024 * 1024, metavar="BYTES",
         help="largest HTTP request body accepted (default 64 MiB)")
    _http_limit_flags(flag)
    add_http_tls_flags(flag, bool_flag)
    flag("--http-restricted-api", type=restriction, action="append", default=[],
         metavar="CATEGORY[,CATEGORY]:KEY=VALUE",
         help="serve these API categories only to requests with the header KEY: VALUE (repeatable)")
    flag("--grpc-restricted-protocol", "--grpc-restricted-api", dest="grpc_restricted_api",
         type=protocol_restriction, action="append", default=[], metavar="CATEGORY[,CATEGORY]:KEY=VALUE",
         help="serve these API categories only to calls with the metadata triton-grpc-protocol-KEY: VALUE "
              "(repeatable)")
    for transport in ("http", "grpc"):
        flag(f"--{transport}-header-forward-pattern", type=header_pattern, default="", metavar="REGEX",
             help=f"forward the {'headers' if transport == 'http' else 'metadata'} of inference requests "
                  "whose names match (anywhere, in any case) to the model as request parameters")
    _grpc_transport_flags(flag, bool_flag)
    flag("--grpc-max-message-size", type=int, default=256 * 1024 * 1024, metavar="BYTES",
         help="largest gRPC message received or sent (default 256 MiB)")
    flag("--grpc-max-stream-inflight", type=stream_limit, default=1024, metavar="N",
         help="requests of one ModelStreamInfer stream that may await their responses; the stream "
              "reads no more until one is answered (default 1024)")
    flag("--grpc-server", choices=GRPC_SERVERS, default=os.environ.get("CORESERVE_GRPC_SERVER") or "native",
         help="what serves gRPC: native (coreserve's own HTTP/2 server, 2-3x the calls per second of "
              "grpcio) or grpcio (grpc.aio) (default $CORESERVE_GRPC_SERVER, else native)")
    flag("--metrics-config", type=metrics_config, action="append", default=[], metavar="SETTING=VALUE",
         help="counter_latencies=BOOL (default true), summary_latencies=BOOL (default false), "
              "histogram_latencies=BOOL (default false), summary_quantiles=Q:E,... (default "
              f"{METRICS_SETTINGS['summary_quantiles']}) (repeatable)")
    bool_flag("--allow-cpu-metrics", True, "report the nv_cpu_* families (default true)")
    bool_flag("--allow-gpu-metrics", True, "report the nv_gpu_* families where NVML (the nvidia-ml-py "
                                           "package) finds GPUs (default true)")
    flag("--metrics-interval-ms", type=interval_ms, default=2000.0, metavar="MS",
         help="how often the CPU and GPU families are read (default 2000)")
    bool_flag("--exit-on-error", True, "exit at start-up if a model fails to load (default true)")
    bool_flag("--strict-readiness", True, "report ready only when every model is ready (default true)")
    flag("--disable-auto-complete-config", action="store_true",
         help="do not complete model configurations from the model files")
    bool_flag("--strict-model-config", None, "deprecated in Triton: true is --disable-auto-complete-config")
    flag("--backend-config", type=backend_config, action="append", default=[], metavar="BACKEND,KEY=VALUE",
         help="a setting handed to a backend (repeatable)")
    flag("--backend-directory", type=Path, default=DEFAULT_BACKEND_DIRECTORY, metavar="DIR",
         help="where Python-based backends are found: a model whose backend is no installed one runs "
              "DIR/<backend>/model.py with the python backend, as on Triton "
              f"(default {DEFAULT_BACKEND_DIRECTORY})")
    flag("--python-env-cache-dir", type=Path, default=None, metavar="DIR",
         help="where the python backend keeps the environments it builds from models' requirements.txt, "
              "shared by models and servers with the same requirements (--backend-config "
              "python,env-cache-dir=DIR) (default $XDG_CACHE_HOME/coreserve/python-envs, else "
              "~/.cache/coreserve/python-envs)")
    flag("--cache-config", type=cache_setting, action="append", default=[], metavar="CACHE,KEY=VALUE",
         help="the response cache that models with response_cache { enable: true } use: local,size=BYTES, "
              "or redis,host=HOST and redis,port=PORT (repeated) (default: none, nothing is cached)")
    flag("--response-cache-byte-size", type=non_negative_int, default=None, metavar="BYTES",
         help="deprecated in Triton: --cache-config local,size=BYTES")
    flag("--rate-limit", type=str.lower, choices=("off", "execution_count"), default="off",
         help="execution_count: an instance executes only when the resources its instance_group's "
              "rate_limiter names are free, higher priority first (default off)")
    flag("--rate-limit-resource", type=rate_limit_resource, action="append", default=[],
         metavar="NAME:COUNT[:DEVICE]",
         help="how many copies of a resource exist, on DEVICE or on every device (repeatable; default: "
              "the most any instance asks for; once given, every resource a model names needs one)")
    flag("--exit-timeout-secs", type=float, default=30.0,
         help="how long shutdown waits for in-flight requests (default 30)")
    flag("--log-verbose", type=non_negative_int, default=0, metavar="N", help="verbose logging when N > 0")
    for level in ("info", "warning", "error"):
        bool_flag(f"--log-{level}", True, f"log {level} messages (default true)")
    flag("--log-format", choices=("default", "ISO8601"), default="default",
         help="default: 'I1123 16:04:21.470339 <pid> <logger>] message'; "
              "ISO8601: '2026-11-23T16:04:21Z I ...'")
    flag("--log-file", default="", metavar="PATH",
         help="append the log to this file (default: standard error)")
    _trace_flags(flag)
    # fmt: on
    add_accepted_flags(parser)
    return parser


def _trace_flags(flag: Callable[..., Any]) -> None:
    """tritonserver's --trace-config, and its older --trace-* flags."""
    # fmt: off
    flag("--trace-config", action="append", default=[], metavar="[MODE,]SETTING=VALUE",
         help="level=OFF|TIMESTAMPS|TENSORS (repeatable; default OFF), rate=N (trace every N-th request; "
              "default 1000), count=N (traces to take; default -1, no limit), mode=triton|opentelemetry "
              "(default triton), triton,file=PATH, triton,log-frequency=N (write the file every N traces; "
              "default 0, at exit), opentelemetry,url=URL (default http://localhost:4318/v1/traces), "
              "opentelemetry,resource=KEY=VALUE, opentelemetry,bsp_max_queue_size=N (2048), "
              "opentelemetry,bsp_schedule_delay=MS (5000), opentelemetry,bsp_max_export_batch_size=N (512)")
    flag("--trace-file", default=None, metavar="PATH",
         help="deprecated in Triton: --trace-config triton,file=PATH")
    flag("--trace-level", action="append", default=[], metavar="LEVEL",
         help="deprecated in Triton: --trace-config level=LEVEL")
    flag("--trace-rate", type=int, default=None, metavar="N",
         help="deprecated in Triton: --trace-config rate=N")
    flag("--trace-count", type=int, default=None, metavar="N",
         help="deprecated in Triton: --trace-config count=N")
    flag("--trace-log-frequency", type=int, default=None, metavar="N",
         help="deprecated in Triton: --trace-config triton,log-frequency=N")
    # fmt: on


def _grpc_transport_flags(flag: Callable[..., Any], bool_flag: Callable[..., None]) -> None:
    """tritonserver's gRPC TLS, keepalive, connection age and compression flags."""
    # fmt: off
    bool_flag("--grpc-use-ssl", False, "serve gRPC over TLS (default false)")
    bool_flag("--grpc-use-ssl-mutual", False, "serve gRPC over TLS and require client certificates signed by "
                                              "--grpc-root-cert (default false)")
    flag("--grpc-server-cert", type=Path, default=None, metavar="PEM_FILE", help="the server's certificate")
    flag("--grpc-server-key", type=Path, default=None, metavar="PEM_FILE", help="the server's private key")
    flag("--grpc-root-cert", type=Path, default=None, metavar="PEM_FILE",
         help="the certificate that signs client certificates (mutual TLS)")
    flag("--grpc-infer-response-compression-level", type=str.lower, choices=("none", "low", "medium", "high"),
         default="none", help="compression of responses, for clients that accept it (default none)")
    bool_flag("--reuse-grpc-port", False, "let other servers bind the same gRPC port (default false)")
    for name, default in (
        ("--grpc-keepalive-time", "7200000"),
        ("--grpc-keepalive-timeout", "20000"),
        ("--grpc-http2-max-pings-without-data", "2"),
        ("--grpc-http2-min-recv-ping-interval-without-data", "300000"),
        ("--grpc-http2-max-ping-strikes", "2"),
        ("--grpc-max-connection-age", "none"),
        ("--grpc-max-connection-age-grace", "none"),
    ):
        unit = "" if "ping" in name and "interval" not in name else " (milliseconds)"
        flag(name, type=non_negative_int, default=None, metavar="N",
             help=f"gRPC's setting of that name{unit}; default {default}")
    flag("--grpc-keepalive-permit-without-calls", type=parse_bool, default=None, metavar="BOOL",
         help="allow keepalive pings without calls in flight (default false)")
    flag("--grpc-handshake-timeout-secs", type=positive_secs, default=DEFAULT_HANDSHAKE_TIMEOUT_S,
         metavar="SECS", help="a new connection's TLS handshake, then its HTTP/2 preface, must each arrive "
                              f"within this, or it is closed (default {DEFAULT_HANDSHAKE_TIMEOUT_S:g})")
    # fmt: on


def _http_limit_flags(flag: Callable[..., Any]) -> None:
    """The limits and timeouts of the HTTP server (Triton has no flags for them)."""
    from coreserve.server.httpd import DEFAULT_HTTP_LIMITS, MAX_CONNECTIONS_CAP

    limits = DEFAULT_HTTP_LIMITS
    # fmt: off
    flag("--http-max-header-count", type=positive_int, default=limits.max_header_count, metavar="N",
         help=f"most header fields in one request; more get 431 (default {limits.max_header_count})")
    flag("--http-max-header-size", type=positive_int, default=limits.max_header_size, metavar="BYTES",
         help="most bytes of header names and values in one request; more get 431 "
              f"(default {limits.max_header_size // 1024} KiB)")
    flag("--http-max-url-size", type=positive_int, default=limits.max_url_size, metavar="BYTES",
         help=f"longest request URL; longer gets 414 (default {limits.max_url_size // 1024} KiB)")
    flag("--http-header-timeout-secs", type=positive_secs, default=limits.header_timeout, metavar="SECS",
         help="time for a request's headers to arrive from its first byte (then 408 and close), and for "
              f"a new connection to send its first byte (then close) (default {limits.header_timeout:g})")
    flag("--http-body-timeout-secs", type=positive_secs, default=limits.body_timeout, metavar="SECS",
         help=f"longest wait between two reads of a request body; then 408 and close "
              f"(default {limits.body_timeout:g})")
    flag("--http-keepalive-timeout-secs", type=positive_secs, default=limits.keepalive_timeout,
         metavar="SECS", help=f"an idle keep-alive connection is closed after this long "
                              f"(default {limits.keepalive_timeout:g})")
    flag("--http-write-timeout-secs", type=positive_secs, default=limits.write_timeout, metavar="SECS",
         help="a client that takes none of its answer for this long is dropped "
              f"(default {limits.write_timeout:g})")
    flag("--http-max-connections", type=positive_int, default=limits.max_connections, metavar="N",
         help="most open HTTP connections; more get 503 and are closed (default: 3/4 of the open-file "
              f"limit, at most {MAX_CONNECTIONS_CAP})")
    flag("--http-max-pipelined", type=positive_int, default=limits.max_pipelined, metavar="N",
         help="requests read ahead of their answers on one connection before reading pauses "
              f"(default {limits.max_pipelined})")
    # fmt: on


def parse_serve_args(argv: Sequence[str]) -> argparse.Namespace:
    """The serving command line; exits with code 2 on a mistake, naming the closest real flag."""
    parser = serve_parser()
    args, leftovers = parser.parse_known_args(argv)
    if leftovers:
        refuse_unknown(parser, leftovers)
    if "*" in args.load_models and len(args.load_models) > 1:  # an error in Triton too
        parser.error("--load-model=* loads every model: name no other --load-model beside it")
    use_ssl = args.grpc_use_ssl or args.grpc_use_ssl_mutual
    if use_ssl and not (args.grpc_server_cert and args.grpc_server_key):
        parser.error("--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key")
    if args.grpc_server not in GRPC_SERVERS:  # (argparse checks the flag, not its default)
        known = ", ".join(GRPC_SERVERS)
        parser.error(f"$CORESERVE_GRPC_SERVER must be one of {known}, got '{args.grpc_server}'")
    check_http_tls_flags(parser, args)
    _check_cache_flags(parser, args)
    _check_worker_flags(parser, args)
    try:  # each value was checked alone; together, each place has one
        parse_memory_budgets(args.model_memory_budget or [])
    except MemoryBudgetError as exc:
        parser.error(f"argument --model-memory-budget: {exc}")
    # (--load-model outside explicit mode is an error in Triton too)
    for name, value in (
        ("--model-load-on-demand", args.model_load_on_demand),
        ("--model-memory-budget", args.model_memory_budget),
        ("--load-model", args.load_models),
    ):
        if value and args.model_control_mode != ControlMode.EXPLICIT.value:
            parser.error(f"{name} needs --model-control-mode=explicit (got {args.model_control_mode})")
    for name, feature, restrictions in (
        ("--http-restricted-api", "api", args.http_restricted_api),
        ("--grpc-restricted-protocol", "protocol", args.grpc_restricted_api),
    ):
        named = [category for restriction in restrictions for category in restriction.categories]
        for category in sorted({category for category in named if named.count(category) > 1}):
            # Triton's words: each category has one key and value
            parser.error(
                f"argument {name}: restricted {feature} '{category}' can not be specified in multiple "
                "config groups"
            )
    return args


def _check_worker_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Several workers share fixed ports: each binds them itself (SO_REUSEPORT)."""
    if max(args.http_thread_count, args.grpc_infer_thread_count) == 1:
        return
    for name, port in (
        ("--http-port", args.http_port),
        ("--grpc-port", args.grpc_port),
        ("--openai-port", args.openai_port),
    ):
        if port == 0:
            parser.error(f"{name}=0 (any free port) cannot be shared by several workers: name the port")


def _check_cache_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuses a --cache-config no cache can be made of, in one line (Triton's words where it has them)."""
    from coreserve.scheduling.cache.config import CacheConfigError, check_cache_config

    if args.response_cache_byte_size is not None and args.cache_config:
        parser.error(
            "Incompatible flags --response-cache-byte-size and --cache-config both provided. "
            "Please provide one or the other."
        )
    try:
        check_cache_config(cache_config(args))
    except CacheConfigError as exc:
        parser.error(str(exc))
