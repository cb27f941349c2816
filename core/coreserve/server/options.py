"""The settings of a server, as the `coreserve` command line gives them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from coreserve.backend.python_based import DEFAULT_BACKEND_DIRECTORY
from coreserve.repository import ControlMode
from coreserve.repository.memory.budgets import MemoryBudgets
from coreserve.scheduling.rate_limiter import ResourceSetting
from coreserve.server.grpc import GrpcTransport
from coreserve.server.headers import Restriction
from coreserve.server.httpd import HttpLimits, HttpTls
from coreserve.server.log_settings import LogSettings
from coreserve.tracing import TraceConfig


@dataclass
class ServerOptions:
    """Everything that shapes a running server; field names follow tritonserver's flags."""

    model_repositories: list[str]
    server_id: str = "coreserve"  # --id: the name server metadata gives
    log_settings: LogSettings = field(default_factory=LogSettings)  # --log-*
    trace_config: TraceConfig = field(default_factory=TraceConfig)  # --trace-config, --trace-*
    model_config_name: str = ""  # --model-config-name: configs/<name>.pbtxt where a model has one
    model_namespacing: bool = False  # the same model name may live in several repositories
    model_control_mode: ControlMode = ControlMode.NONE
    load_models: list[str] = field(default_factory=list)
    # --model-load-on-demand (explicit mode): a request for a model not loaded loads it.
    model_load_on_demand: bool = False
    # --model-memory-budget (explicit mode): the loaded models' memory on the host and GPUs.
    model_memory_budgets: MemoryBudgets = field(default_factory=MemoryBudgets)
    repository_poll_secs: float = 15.0
    model_load_thread_count: int = 4
    model_load_retry_count: int = 0  # a version that fails to load is loaded again at once, this often
    # None: a temporary folder of this server's own (never shared with another server),
    # removed when it stops. A folder given here is kept, with what it holds.
    cache_dir: Path | None = None
    # --http-thread-count, --grpc-infer-thread-count: worker processes serving each (server/workers).
    http_workers: int = 1
    grpc_workers: int = 1
    worker_heartbeat_timeout_s: float = 5.0  # --worker-heartbeat-timeout-secs: a silent worker is hung
    http_reuse_port: bool = False  # --reuse-http-port
    allow_http: bool = True
    http_address: str = "0.0.0.0"
    http_port: int = 8000
    http_max_input_size: int = 64 * 1024 * 1024
    http_restricted_api: list[Restriction] = field(default_factory=list)
    http_header_forward_pattern: str = ""  # headers an inference request forwards to its model
    http_limits: HttpLimits = field(default_factory=HttpLimits)  # --http-max-*, --http-*-timeout-secs
    http_tls: HttpTls | None = None  # --http-use-ssl*: None serves plain HTTP
    allow_grpc: bool = True
    grpc_address: str = "0.0.0.0"
    grpc_port: int = 8001
    grpc_max_message_size: int = 256 * 1024 * 1024
    grpc_max_stream_inflight: int = 1024  # open requests per ModelStreamInfer stream
    # --grpc-server: "native" (`coreserve.server.grpc.native`'s HTTP/2) or "grpcio" (grpc.aio).
    grpc_server: str = "native"
    grpc_restricted_api: list[Restriction] = field(default_factory=list)  # --grpc-restricted-protocol
    grpc_header_forward_pattern: str = ""  # metadata an inference call forwards to its model
    grpc_transport: GrpcTransport = field(default_factory=GrpcTransport)  # TLS, keepalive, compression
    # --openai-port: the OpenAI-compatible frontend (core-server[openai]); None: not served.
    openai_port: int | None = None
    openai_address: str = "0.0.0.0"
    allow_metrics: bool = True
    metrics_address: str = "0.0.0.0"
    metrics_port: int = 8002
    # False: metrics are collected (allow_metrics) but no port serves them; the in-process
    # API (coreserve.Server.metrics()) reads them without one.
    open_metrics_port: bool = True
    # --metrics-config: Triton's defaults (latency counters on, summaries and histograms off).
    counter_latencies: bool = True
    summary_latencies: bool = False
    histogram_latencies: bool = False
    summary_quantiles: tuple[float, ...] = (0.5, 0.9, 0.95, 0.99, 0.999)
    allow_cpu_metrics: bool = True
    allow_gpu_metrics: bool = True  # reported where NVML (nvidia-ml-py) finds GPUs
    metrics_interval_ms: float = 2000.0  # how often the CPU and GPU families are polled
    exit_on_error: bool = True
    strict_readiness: bool = True
    auto_complete_config: bool = True
    backend_config: dict[str, dict[str, str]] = field(default_factory=dict)
    # --backend-directory: where Triton's Python-based backends (`<dir>/<backend>/model.py`) are found.
    backend_directory: Path = DEFAULT_BACKEND_DIRECTORY
    # --cache-config: cache name -> its settings ({"local": {"size": "1048576"}}); empty: no cache.
    cache_config: dict[str, dict[str, str]] = field(default_factory=dict)
    exit_timeout_secs: float = 30.0
    # --rate-limit: "execution_count" makes instances wait for the resources their rate_limiter names.
    rate_limit: str = "off"
    rate_limit_resources: list[ResourceSetting] = field(default_factory=list)  # --rate-limit-resource
