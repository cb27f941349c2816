"""The server's settings (ServerOptions and the parts it holds) made of the parsed serving flags."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from coreserve import InvalidArgumentError
from coreserve.cli._tls import http_tls
from coreserve.cli._values import METRICS_SETTINGS, summary_quantiles
from coreserve.repository.manager import ControlMode
from coreserve.repository.memory.budgets import parse_memory_budgets

if TYPE_CHECKING:
    from coreserve.server import ServerOptions
    from coreserve.server.grpc import GrpcTransport
    from coreserve.server.httpd import HttpLimits
    from coreserve.server.log_settings import LogSettings
    from coreserve.tracing import TraceConfig


def cache_config(args: argparse.Namespace) -> dict[str, dict[str, str]]:
    """--cache-config as cache -> settings; --response-cache-byte-size N is local,size=N."""
    config: dict[str, dict[str, str]] = {}
    for cache, key, value in args.cache_config:
        config.setdefault(cache, {})[key] = value
    if args.response_cache_byte_size is not None:
        config["local"] = {"size": str(args.response_cache_byte_size)}
    return config


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


def _http_limits(args: argparse.Namespace) -> HttpLimits:
    from coreserve.server.httpd import HttpLimits

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


def server_options(args: argparse.Namespace) -> ServerOptions:
    """The server's settings from the parsed serving flags; InvalidArgumentError for a bad combination."""
    from coreserve.server import ServerOptions

    backend_config: dict[str, dict[str, str]] = {}
    for backend, key, value in args.backend_config:
        backend_config.setdefault(backend, {})[key] = value
    if args.python_env_cache_dir is not None:  # plugin-python reads it as one of its settings
        backend_config.setdefault("python", {})["env-cache-dir"] = str(args.python_env_cache_dir)
    metrics = dict(args.metrics_config)
    extra = {"cache_dir": args.model_cache_dir} if args.model_cache_dir else {}
    return ServerOptions(
        model_repositories=list(dict.fromkeys(args.model_repositories)),  # one given twice: once, as Triton
        server_id=args.server_id,
        log_settings=_log_settings(args),
        trace_config=_trace_config(args),
        model_config_name=args.model_config_name,
        model_namespacing=args.model_namespacing,
        grpc_transport=_grpc_transport(args),
        model_control_mode=ControlMode(args.model_control_mode),
        load_models=args.load_models,
        model_load_on_demand=args.model_load_on_demand,
        model_memory_budgets=parse_memory_budgets(args.model_memory_budget or []),
        repository_poll_secs=args.repository_poll_secs,
        model_load_thread_count=args.model_load_thread_count,
        model_load_retry_count=args.model_load_retry_count,
        http_restricted_api=args.http_restricted_api,
        grpc_restricted_api=args.grpc_restricted_api,
        http_header_forward_pattern=args.http_header_forward_pattern,
        grpc_header_forward_pattern=args.grpc_header_forward_pattern,
        **extra,
        http_workers=args.http_thread_count,
        http_reuse_port=args.reuse_http_port,
        grpc_workers=args.grpc_infer_thread_count,
        worker_heartbeat_timeout_s=args.worker_heartbeat_timeout_secs,
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
            "summary_quantiles", summary_quantiles(METRICS_SETTINGS["summary_quantiles"])
        ),
        allow_cpu_metrics=args.allow_cpu_metrics,
        allow_gpu_metrics=args.allow_gpu_metrics,
        metrics_interval_ms=args.metrics_interval_ms,
        exit_on_error=args.exit_on_error,
        strict_readiness=args.strict_readiness,
        auto_complete_config=not (args.disable_auto_complete_config or bool(args.strict_model_config)),
        backend_config=backend_config,
        backend_directory=args.backend_directory,
        cache_config=cache_config(args),
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
    from coreserve.server.grpc import GrpcTls, GrpcTransport

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
        handshake_timeout_s=args.grpc_handshake_timeout_secs,
    )
