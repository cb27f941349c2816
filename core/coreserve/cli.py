"""The `coreserve` command. Flags are spelled as tritonserver's where they mean the same.

coreserve --model-repository DIR [--http-port 8000] [--exit-on-error BOOL] ...
coreserve backends
coreserve new-backend NAME [--directory DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coreserve import InvalidArgumentError, __version__
from coreserve.cli_tls import add_http_tls_flags, check_http_tls_flags, http_tls
from coreserve.cli_triton import accepted_flags_warning, add_accepted_flags, parse_bool, refuse_unknown
from coreserve.repository.manager import ControlMode
from coreserve.server.restrictions import Restriction, parse_restriction

if TYPE_CHECKING:
    from coreserve.scheduling.rate_limiter import ResourceSetting
    from coreserve.server import ServerOptions
    from coreserve.server.grpc_transport import GrpcTransport
    from coreserve.server.http_limits import HttpLimits
    from coreserve.server.log_settings import LogSettings
    from coreserve.tracing import TraceConfig


_bool = parse_bool  # true/false, on/off, 1/0: what tritonserver accepts


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {value}")
    return value


def _backend_config(text: str) -> tuple[str, str, str]:
    backend, _, setting = text.partition(",")
    key, equals, value = setting.partition("=")
    if not backend or not key or not equals:
        raise argparse.ArgumentTypeError(f"expected <backend>,<key>=<value>, got '{text}'")
    return backend, key, value


def _cache_setting(text: str) -> tuple[str, str, str]:
    from coreserve.scheduling.cache_config import CacheConfigError, parse_cache_setting

    try:
        return parse_cache_setting(text)
    except CacheConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _cache_config(args: argparse.Namespace) -> dict[str, dict[str, str]]:
    """--cache-config as cache -> settings; --response-cache-byte-size N is local,size=N."""
    config: dict[str, dict[str, str]] = {}
    for cache, key, value in args.cache_config:
        config.setdefault(cache, {})[key] = value
    if args.response_cache_byte_size is not None:
        config["local"] = {"size": str(args.response_cache_byte_size)}
    return config


def _rate_limit_resource(text: str) -> ResourceSetting:
    from coreserve.scheduling.rate_limiter import RateLimitSettingError, parse_resource_setting

    try:
        return parse_resource_setting(text)
    except RateLimitSettingError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number above 0, got {value}")
    return value


def _positive_secs(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got '{text}'") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, got '{text}'")
    return value


def _stream_limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1, got {value}")
    return value


# --metrics-config settings (Triton's) and their defaults.
METRICS_SETTINGS = {
    "counter_latencies": "true",
    "summary_latencies": "false",
    "histogram_latencies": "false",
    "summary_quantiles": "0.5:0.05,0.9:0.01,0.95:0.001,0.99:0.001,0.999:0.0001",
}


def _restriction(text: str) -> Restriction:
    try:
        return parse_restriction(text)
    except InvalidArgumentError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def _metrics_config(text: str) -> tuple[str, bool | tuple[float, ...]]:
    key, equals, value = text.partition("=")
    if key not in METRICS_SETTINGS or not equals:
        raise argparse.ArgumentTypeError(
            f"expected <setting>=<value> with a setting among {', '.join(METRICS_SETTINGS)}; got '{text}'"
        )
    if key == "summary_quantiles":
        return key, _summary_quantiles(value)
    try:
        return key, _bool(value)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{key}: {exc}") from None


def _summary_quantiles(text: str) -> tuple[float, ...]:
    """Triton's `<quantile>:<error>,...`: the quantiles, each in (0, 1) with an error in [0, 1]."""
    quantiles = []
    for item in text.strip('"').split(","):
        quantile, colon, error = item.partition(":")
        try:
            point, margin = float(quantile), float(error)
        except ValueError:
            point = margin = float("nan")
        if not colon or not 0 < point < 1 or not 0 <= margin <= 1:
            raise argparse.ArgumentTypeError(
                f"summary_quantiles: expected <quantile>:<error>,... with each quantile above 0 and below 1 "
                f"and each error from 0 to 1 (e.g. 0.5:0.05,0.99:0.001); got '{item}'"
            )
        quantiles.append(point)
    return tuple(sorted(set(quantiles)))


def _interval_ms(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of milliseconds, got '{text}'") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of milliseconds above 0, got '{text}'")
    return value


def _serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="coreserve",
        usage="coreserve --model-repository DIR [flag ...]   (coreserve --help lists them)",
        description="Serve the models of Triton-style model repositories over KServe v2 HTTP and gRPC.",
        epilog="Run `coreserve backends` to list the installed backends, "
        "`coreserve new-backend NAME` to write a new one.",
    )
    flag = parser.add_argument

    # fmt: off
    def bool_flag(name: str, default: bool, help: str | None = None) -> None:
        # Accepts --flag, --flag=false and --flag false, as tritonserver does.
        flag(name, type=_bool, nargs="?", const=True, default=default, metavar="BOOL", help=help)

    flag("--version", action="version", version=f"coreserve {__version__}")
    flag("--id", dest="server_id", default="coreserve",
         help="the name server metadata gives (default coreserve)")
    flag("--model-repository", "--model-store", dest="model_repositories", action="append", required=True,
         metavar="DIR_OR_URL", help="a model repository: a folder, or s3://… gs://… (repeatable)")
    flag("--model-control-mode", choices=[mode.value for mode in ControlMode], default="none",
         help="none: load everything at start-up; poll: also apply repository changes; "
              "explicit: load what --load-model names, then what the repository API asks")
    flag("--load-model", dest="load_models", action="append", default=[], metavar="NAME",
         help="a model to load at start-up in explicit mode (repeatable; * for all)")
    flag("--repository-poll-secs", type=float, default=15.0, help="seconds between scans in poll mode")
    flag("--model-load-thread-count", type=int, default=4, help="models that load at the same time")
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
    flag("--http-restricted-api", type=_restriction, action="append", default=[],
         metavar="CATEGORY[,CATEGORY]:KEY=VALUE",
         help="serve these API categories only to requests with the header KEY: VALUE (repeatable)")
    flag("--grpc-restricted-protocol", "--grpc-restricted-api", dest="grpc_restricted_api", type=_restriction,
         action="append", default=[], metavar="CATEGORY[,CATEGORY]:KEY=VALUE",
         help="serve these API categories only to calls with the metadata triton-grpc-protocol-KEY: VALUE "
              "(repeatable)")
    _grpc_transport_flags(flag, bool_flag)
    flag("--grpc-max-message-size", type=int, default=256 * 1024 * 1024, metavar="BYTES",
         help="largest gRPC message received or sent (default 256 MiB)")
    flag("--grpc-max-stream-inflight", type=_stream_limit, default=1024, metavar="N",
         help="requests of one ModelStreamInfer stream that may await their responses; the stream "
              "reads no more until one is answered (default 1024)")
    flag("--grpc-server", choices=("grpcio", "native"),
         default=os.environ.get("CORESERVE_GRPC_SERVER", "grpcio"),
         help="what serves gRPC: grpcio (grpc.aio) or native (coreserve's own HTTP/2 server, faster on "
              "small calls; plain HTTP/2 only, no --grpc-use-ssl) (default $CORESERVE_GRPC_SERVER or grpcio)")
    flag("--metrics-config", type=_metrics_config, action="append", default=[], metavar="SETTING=VALUE",
         help="counter_latencies=BOOL (default true), summary_latencies=BOOL (default false), "
              "histogram_latencies=BOOL (default false), summary_quantiles=Q:E,... (default "
              f"{METRICS_SETTINGS['summary_quantiles']}) (repeatable)")
    bool_flag("--allow-cpu-metrics", True, "report the nv_cpu_* families (default true)")
    bool_flag("--allow-gpu-metrics", True, "report the nv_gpu_* families where NVML (the nvidia-ml-py "
                                           "package) finds GPUs (default true)")
    flag("--metrics-interval-ms", type=_interval_ms, default=2000.0, metavar="MS",
         help="how often the CPU and GPU families are read (default 2000)")
    bool_flag("--exit-on-error", True, "exit at start-up if a model fails to load (default true)")
    bool_flag("--strict-readiness", True, "report ready only when every model is ready (default true)")
    flag("--disable-auto-complete-config", action="store_true",
         help="do not complete model configurations from the model files")
    bool_flag("--strict-model-config", False, "deprecated in Triton: true is --disable-auto-complete-config")
    flag("--backend-config", type=_backend_config, action="append", default=[], metavar="BACKEND,KEY=VALUE",
         help="a setting handed to a backend (repeatable)")
    flag("--cache-config", type=_cache_setting, action="append", default=[], metavar="CACHE,KEY=VALUE",
         help="the response cache that models with response_cache { enable: true } use: local,size=BYTES, "
              "or redis,host=HOST and redis,port=PORT (repeated) (default: none, nothing is cached)")
    flag("--response-cache-byte-size", type=_non_negative_int, default=None, metavar="BYTES",
         help="deprecated in Triton: --cache-config local,size=BYTES")
    flag("--rate-limit", choices=("off", "execution_count"), default="off",
         help="execution_count: an instance executes only when the resources its instance_group's "
              "rate_limiter names are free, higher priority first (default off)")
    flag("--rate-limit-resource", type=_rate_limit_resource, action="append", default=[],
         metavar="NAME:COUNT[:DEVICE]",
         help="how many copies of a resource exist, on DEVICE or on every device (repeatable; default: "
              "the most any instance asks for; once given, every resource a model names needs one)")
    flag("--exit-timeout-secs", type=float, default=30.0,
         help="how long shutdown waits for in-flight requests (default 30)")
    flag("--log-verbose", type=_non_negative_int, default=0, metavar="N", help="verbose logging when N > 0")
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


def _trace_config(args: argparse.Namespace) -> TraceConfig:
    from coreserve.tracing.config import parse_trace_config

    return parse_trace_config(
        args.trace_config,
        trace_file=args.trace_file,
        levels=args.trace_level,
        rate=args.trace_rate,
        count=args.trace_count,
        log_frequency=args.trace_log_frequency,
    )


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
    flag("--grpc-infer-response-compression-level", choices=("none", "low", "medium", "high"), default="none",
         help="compression of responses, for clients that accept it (default none)")
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
        flag(name, type=_non_negative_int, default=None, metavar="N",
             help=f"gRPC's setting of that name{unit}; default {default}")
    flag("--grpc-keepalive-permit-without-calls", type=_bool, default=None, metavar="BOOL",
         help="allow keepalive pings without calls in flight (default false)")
    # fmt: on


def _http_limit_flags(flag: Callable[..., Any]) -> None:
    """The limits and timeouts of the HTTP server (Triton has no flags for them)."""
    from coreserve.server.http_limits import DEFAULT_HTTP_LIMITS, MAX_CONNECTIONS_CAP

    limits = DEFAULT_HTTP_LIMITS
    # fmt: off
    flag("--http-max-header-count", type=_positive_int, default=limits.max_header_count, metavar="N",
         help=f"most header fields in one request; more get 431 (default {limits.max_header_count})")
    flag("--http-max-header-size", type=_positive_int, default=limits.max_header_size, metavar="BYTES",
         help="most bytes of header names and values in one request; more get 431 "
              f"(default {limits.max_header_size // 1024} KiB)")
    flag("--http-max-url-size", type=_positive_int, default=limits.max_url_size, metavar="BYTES",
         help=f"longest request URL; longer gets 414 (default {limits.max_url_size // 1024} KiB)")
    flag("--http-header-timeout-secs", type=_positive_secs, default=limits.header_timeout, metavar="SECS",
         help="time for a request's headers to arrive from its first byte (then 408 and close), and for "
              f"a new connection to send its first byte (then close) (default {limits.header_timeout:g})")
    flag("--http-body-timeout-secs", type=_positive_secs, default=limits.body_timeout, metavar="SECS",
         help=f"longest wait between two reads of a request body; then 408 and close "
              f"(default {limits.body_timeout:g})")
    flag("--http-keepalive-timeout-secs", type=_positive_secs, default=limits.keepalive_timeout,
         metavar="SECS", help=f"an idle keep-alive connection is closed after this long "
                              f"(default {limits.keepalive_timeout:g})")
    flag("--http-write-timeout-secs", type=_positive_secs, default=limits.write_timeout, metavar="SECS",
         help="a client that takes none of its answer for this long is dropped "
              f"(default {limits.write_timeout:g})")
    flag("--http-max-connections", type=_positive_int, default=limits.max_connections, metavar="N",
         help="most open HTTP connections; more get 503 and are closed (default: 3/4 of the open-file "
              f"limit, at most {MAX_CONNECTIONS_CAP})")
    flag("--http-max-pipelined", type=_positive_int, default=limits.max_pipelined, metavar="N",
         help="requests read ahead of their answers on one connection before reading pauses "
              f"(default {limits.max_pipelined})")
    # fmt: on


def _http_limits(args: argparse.Namespace) -> HttpLimits:
    from coreserve.server.http_limits import HttpLimits

    return HttpLimits(
        max_header_count=args.http_max_header_count,
        max_header_size=args.http_max_header_size,
        max_url_size=args.http_max_url_size,
        header_timeout=args.http_header_timeout_secs,
        body_timeout=args.http_body_timeout_secs,
        keepalive_timeout=args.http_keepalive_timeout_secs,
        write_timeout=args.http_write_timeout_secs,
        max_connections=args.http_max_connections,
        max_pipelined=args.http_max_pipelined,
    )


def _options(args: argparse.Namespace) -> ServerOptions:
    from coreserve.server import ServerOptions

    backend_config: dict[str, dict[str, str]] = {}
    for backend, key, value in args.backend_config:
        backend_config.setdefault(backend, {})[key] = value
    metrics = dict(args.metrics_config)
    extra = {"cache_dir": args.model_cache_dir} if args.model_cache_dir else {}
    return ServerOptions(
        model_repositories=args.model_repositories,
        server_id=args.server_id,
        log_settings=_log_settings(args),
        trace_config=_trace_config(args),
        model_config_name=args.model_config_name,
        model_namespacing=args.model_namespacing,
        grpc_transport=_grpc_transport(args),
        model_control_mode=ControlMode(args.model_control_mode),
        load_models=args.load_models,
        repository_poll_secs=args.repository_poll_secs,
        model_load_thread_count=args.model_load_thread_count,
        http_restricted_api=args.http_restricted_api,
        grpc_restricted_api=args.grpc_restricted_api,
        **extra,
        allow_http=args.allow_http,
        http_address=args.http_address,
        http_port=args.http_port,
        http_max_input_size=args.http_max_input_size,
        openai_port=args.openai_port,
        openai_address=args.openai_address or args.http_address,
        http_limits=_http_limits(args),
        http_tls=http_tls(args),
        allow_grpc=args.allow_grpc,
        grpc_address=args.grpc_address,
        grpc_port=args.grpc_port,
        grpc_max_message_size=args.grpc_max_message_size,
        grpc_max_stream_inflight=args.grpc_max_stream_inflight,
        grpc_server=args.grpc_server,
        allow_metrics=args.allow_metrics,
        metrics_address=args.metrics_address or args.http_address,
        metrics_port=args.metrics_port,
        counter_latencies=metrics.get("counter_latencies", True),
        summary_latencies=metrics.get("summary_latencies", False),
        histogram_latencies=metrics.get("histogram_latencies", False),
        summary_quantiles=metrics.get(
            "summary_quantiles", _summary_quantiles(METRICS_SETTINGS["summary_quantiles"])
        ),
        allow_cpu_metrics=args.allow_cpu_metrics,
        allow_gpu_metrics=args.allow_gpu_metrics,
        metrics_interval_ms=args.metrics_interval_ms,
        exit_on_error=args.exit_on_error,
        strict_readiness=args.strict_readiness,
        auto_complete_config=not (args.disable_auto_complete_config or args.strict_model_config),
        backend_config=backend_config,
        cache_config=_cache_config(args),
        exit_timeout_secs=args.exit_timeout_secs,
        rate_limit=args.rate_limit,
        rate_limit_resources=args.rate_limit_resource,
    )


def _log_settings(args: argparse.Namespace) -> LogSettings:
    from coreserve.server.log_settings import LogSettings

    return LogSettings(
        log_file=args.log_file,
        log_info=args.log_info,
        log_warning=args.log_warning,
        log_error=args.log_error,
        log_verbose_level=args.log_verbose,
        log_format=args.log_format,
    )


def _grpc_transport(args: argparse.Namespace) -> GrpcTransport:
    from coreserve.server.grpc_transport import GrpcTls, GrpcTransport

    tls = None
    if args.grpc_use_ssl or args.grpc_use_ssl_mutual:
        if args.grpc_server_cert is None or args.grpc_server_key is None:
            raise InvalidArgumentError("--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key")
        tls = GrpcTls(
            args.grpc_server_cert, args.grpc_server_key, args.grpc_root_cert, args.grpc_use_ssl_mutual
        )
    return GrpcTransport(
        tls=tls,
        compression_level=args.grpc_infer_response_compression_level,
        reuse_port=args.reuse_grpc_port,
        keepalive_time_ms=args.grpc_keepalive_time,
        keepalive_timeout_ms=args.grpc_keepalive_timeout,
        keepalive_permit_without_calls=args.grpc_keepalive_permit_without_calls,
        http2_max_pings_without_data=args.grpc_http2_max_pings_without_data,
        http2_min_recv_ping_interval_without_data_ms=args.grpc_http2_min_recv_ping_interval_without_data,
        http2_max_ping_strikes=args.grpc_http2_max_ping_strikes,
        max_connection_age_ms=args.grpc_max_connection_age,
        max_connection_age_grace_ms=args.grpc_max_connection_age_grace,
    )


def parse_serve_args(argv: Sequence[str]) -> argparse.Namespace:
    """The serving command line; exits with code 2 on a mistake, naming the closest real flag."""
    parser = _serve_parser()
    args, leftovers = parser.parse_known_args(argv)
    if leftovers:
        refuse_unknown(parser, leftovers)
    if "*" in args.load_models and len(args.load_models) > 1:  # an error in Triton too
        parser.error("--load-model=* loads every model: name no other --load-model beside it")
    use_ssl = args.grpc_use_ssl or args.grpc_use_ssl_mutual
    if use_ssl and not (args.grpc_server_cert and args.grpc_server_key):
        parser.error("--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key")
    if use_ssl and args.grpc_server == "native":
        parser.error("--grpc-server native serves plain HTTP/2 only: use --grpc-server grpcio for TLS")
    check_http_tls_flags(parser, args)
    _check_cache_flags(parser, args)
    return args


def _check_cache_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuses a --cache-config no cache can be made of, in one line (Triton's words where it has them)."""
    from coreserve.scheduling.cache_config import CacheConfigError, check_cache_config

    if args.response_cache_byte_size is not None and args.cache_config:
        parser.error(
            "Incompatible flags --response-cache-byte-size and --cache-config both provided. "
            "Please provide one or the other."
        )
    try:
        check_cache_config(_cache_config(args))
    except CacheConfigError as exc:
        parser.error(str(exc))


def _run_server(argv: Sequence[str]) -> int:
    from coreserve.server import ServerRuntime, StartupError
    from coreserve.server.log_settings import ServerLog, StartupLogError

    args = parse_serve_args(argv)
    logger = logging.getLogger("coreserve")
    try:
        options = _options(args)
        log = ServerLog(options.log_settings)
        log.install()
    except (InvalidArgumentError, StartupLogError) as exc:
        print(f"coreserve: error: {exc}", file=sys.stderr)
        return 1
    warning = accepted_flags_warning(args)
    if warning:
        logger.warning("%s", warning)
    _warn_cache_flags(args, logger)
    if args.rate_limit_resource and args.rate_limit == "off":
        logger.warning("--rate-limit-resource has no effect under --rate-limit=off")
    server = ServerRuntime(options, log=log)
    try:
        _event_loop_runner()(server.serve())
    except StartupError as exc:
        logger.error("%s", exc.message)
        return 1
    return 0


def _warn_cache_flags(args: argparse.Namespace, logger: logging.Logger) -> None:
    from coreserve.scheduling.cache_config import check_cache_config

    not_built = check_cache_config(_cache_config(args))
    if not_built:
        logger.warning("%s", not_built)
    if args.response_cache_byte_size is not None:  # as Triton warns
        logger.warning(
            "'--response-cache-byte-size' is deprecated; it means --cache-config=local,size=%d",
            args.response_cache_byte_size,
        )


def _event_loop_runner() -> Callable[[Coroutine[Any, Any, None]], None]:
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return uvloop.run


def _list_backends() -> int:
    from coreserve.backend.plugins import Plugins

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
    """`coreserve ray …` (coreserve.ray), or one line saying which extra it needs."""
    try:
        from coreserve.ray._cli import main as ray_main
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
    if arguments[:1] == ["new-backend"]:
        from coreserve.backend.skeleton import main as new_backend

        return new_backend(arguments[1:])
    return _run_server(arguments)
