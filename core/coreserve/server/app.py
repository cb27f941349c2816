"""The `ServerRuntime`: owns the plugins, the model repository, the data plane and the frontends.

One runtime is one server. The `coreserve` command runs it on its main event loop; the
in-process API (`coreserve.Server`) runs it on a loop thread of its own. Either way the
frontends it opens (HTTP, gRPC, metrics) are thin adapters over its `DataPlane` and
`MetricsReport`, the same objects that in-process callers use.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import shutil
import signal
import tempfile
from collections.abc import Awaitable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coreserve.backend.plugins.manager import Plugins
from coreserve.errors import CoreserveError
from coreserve.repository import ControlMode, ModelLoader, ModelRepository, source_for
from coreserve.repository.adoption import adopt
from coreserve.repository.memory.budgets import MemoryBudgetError
from coreserve.repository.polling import poll_forever
from coreserve.scheduling import LatencyOptions
from coreserve.scheduling.cache.config import make_response_cache
from coreserve.scheduling.rate_limiter import RateLimiter
from coreserve.server.changes import ModelsForBackends
from coreserve.server.dataplane import DataPlane, ServerFlags
from coreserve.server.grpc import GrpcFrontend
from coreserve.server.grpc.native import NativeGrpcFrontend
from coreserve.server.headers import ApiRestrictions, HeaderForwarding
from coreserve.server.log_settings import ServerLog
from coreserve.server.metrics import MetricsFrontend, MetricsReport
from coreserve.server.options import ServerOptions
from coreserve.server.rest import HttpFrontend
from coreserve.server.status_table import backends_table, model_status_table, options_table
from coreserve.server.tls_files import TlsFileError
from coreserve.server.workers import WorkerLink, WorkerRole, message_limit
from coreserve.tracing import Tracer, TraceStartupError

if TYPE_CHECKING:
    from coreserve.server.openai import OpenAIFrontend

logger = logging.getLogger(__name__)
# How long worker 0 of a server of several, as it stops, waits for the others to stop first.
OTHERS_STOP_WAIT_S = 10.0


class StartupError(CoreserveError):
    """The server cannot start (with --exit-on-error, a model failed to load)."""


class ServerRuntime:
    """One coreserve server: start it, serve until told to stop, stop it (all on one event loop)."""

    def __init__(
        self,
        options: ServerOptions,
        plugins: Plugins | None = None,
        log: ServerLog | None = None,
        worker: WorkerRole | None = None,
    ) -> None:
        """`log`: the installed log the logging extension changes (by default one of its own).
        `worker`: this server is that worker of a server of several (`server.workers`)."""
        self.options = options
        self.worker = worker
        self._link: WorkerLink | None = None
        self.plugins = plugins if plugins is not None else Plugins()
        self.response_cache = make_response_cache(options.cache_config)  # checked by the CLI already
        loader = ModelLoader(
            self.plugins.backends(),
            auto_complete=options.auto_complete_config,
            backend_config=options.backend_config,
            backend_directory=options.backend_directory,
            config_name=options.model_config_name,
            load_retries=options.model_load_retry_count,
            latency=self._latency_options(),
            response_cache=self.response_cache,
            rate_limiter=(
                RateLimiter(options.rate_limit_resources) if options.rate_limit == "execution_count" else None
            ),
        )
        # Unless a cache folder is given, each server has its own: servers on one machine
        # must not find (or remove) each other's files.
        self._own_cache = options.cache_dir is None
        if options.cache_dir is not None:
            self.cache_dir = options.cache_dir
        elif worker is not None:
            self.cache_dir = worker.own_cache_folder()
        else:
            self.cache_dir = Path(tempfile.mkdtemp(prefix="coreserve-cache-"))
        try:
            sources = [source_for(location, self.cache_dir) for location in options.model_repositories]
        except CoreserveError as exc:
            self._remove_own_cache()
            raise StartupError(exc.message) from None
        try:
            self.repository = self._repository(options, sources, loader)
        except MemoryBudgetError as exc:  # a GPU's budget NVML cannot read
            self._remove_own_cache()
            raise StartupError(f"--model-memory-budget: {exc}") from None
        self._poller: asyncio.Task[None] | None = None
        self.flags = ServerFlags(strict_readiness=options.strict_readiness)
        self.stopped_in_time = True  # what the exit status says, as Triton's: see `stop`
        self.log = log or ServerLog(options.log_settings)
        try:
            self.tracer = Tracer(options.trace_config)
        except TraceStartupError as exc:
            self._remove_own_cache()
            raise StartupError(str(exc)) from None
        self.dataplane = DataPlane(
            self.repository, self.flags, log=self.log, name=options.server_id, tracer=self.tracer
        )
        loader.client = self.dataplane
        loader.models = ModelsForBackends(
            self.dataplane.change, self.dataplane.apply_change, self.dataplane.model_ready
        )
        loader.activity = self.dataplane
        loader.labels_of = lambda name, version: self.dataplane.model_version(name, version).labels
        self.custom_metrics = loader.metrics
        self.metrics_report: MetricsReport | None = None
        if options.allow_metrics:
            self.metrics_report = MetricsReport(
                self.repository,
                latency=self._latency_options(),
                cpu=options.allow_cpu_metrics,
                gpu=options.allow_gpu_metrics,
                interval_ms=options.metrics_interval_ms,
                custom=self.custom_metrics,
                response_cache=self.response_cache,
                traffic=self.dataplane.traffic,
            )
        if worker is not None:
            loader.workers = worker.count
            shared_cache = "redis" in options.cache_config  # one store for every worker
            limit = message_limit(options)
            self._link = WorkerLink(worker, self.dataplane, self.metrics_report, shared_cache, limit)
            if self._link.owner_link is not None:
                loader.forwarding = self._link.owner_link.scheduler_for
        self.http: HttpFrontend | None = None
        self.grpc: GrpcFrontend | NativeGrpcFrontend | None = None
        self.metrics: MetricsFrontend | None = None
        self.openai: OpenAIFrontend | None = None
        self._openai_type: type[OpenAIFrontend] | None = None

    def _repository(self, options: ServerOptions, sources: list[Any], loader: ModelLoader) -> ModelRepository:
        return ModelRepository(
            sources,
            loader,
            mode=options.model_control_mode,
            # Explicit mode loads only what --load-model names (nothing without it), as Triton.
            startup_models=options.load_models,
            load_threads=options.model_load_thread_count,
            cache_dir=self.cache_dir,
            drain_timeout=options.exit_timeout_secs,
            namespacing=options.model_namespacing,
            on_demand=options.model_load_on_demand,
            memory_budgets=options.model_memory_budgets,
        )

    def _latency_options(self) -> LatencyOptions:
        """The latency families `--metrics-config` asks for (none when metrics are off)."""
        options = self.options
        return LatencyOptions(
            counters=options.counter_latencies,
            summaries=options.summary_latencies and options.allow_metrics,
            histograms=options.histogram_latencies and options.allow_metrics,
            quantiles=options.summary_quantiles,
        )

    async def start(self) -> None:
        """Loads the models, then opens the frontends the options ask for. A worker of a server
        of several joins the others: one that starts while they serve takes on what they serve
        (`repository.adoption`) rather than what the repository's files hold now."""
        self._check_startup()
        faults: dict[str, str] = {}
        truth = await self._connect() if self._link is not None else None
        if truth is None:
            await self.load_models()
        else:
            adopted = await adopt(self.repository, truth)
            # In poll mode the next poll takes on the files as they are now, as the others' do.
            if self.options.model_control_mode is not ControlMode.POLL:
                faults = {f"model/{name}": reason for name, reason in adopted.items()}
            self._log_models()
        if self._link is not None:
            await self._link.join(faults)
        await self.open_frontends()
        if self._link is not None:
            await self._link.serving()
        if self.options.model_control_mode is ControlMode.POLL:
            if self.options.repository_poll_secs > 0:
                self._poller = asyncio.create_task(
                    poll_forever(self.repository, self.options.repository_poll_secs)
                )
            else:  # as Triton: no polling
                logger.info(
                    "--repository-poll-secs=%g: the repository is not polled",
                    self.options.repository_poll_secs,
                )
        self.flags.started = True

    async def _connect(self) -> list[dict[str, Any]] | None:
        """A worker's line to its supervisor: what the serving workers serve, or None (none serves
        yet, or the server loads on demand: each worker then loads for itself)."""
        assert self._link is not None
        cannot = f"worker {self._link.role.index} cannot join its server"
        try:
            return await self._link.connect(adopt=not self.repository.budgeted.on_demand)
        except OSError as exc:
            raise StartupError(f"{cannot}: {exc}") from None
        except CoreserveError as exc:  # the supervisor refused, or went away
            raise StartupError(f"{cannot}: {exc.message}") from None

    def _check_startup(self) -> None:
        """What must hold before any model loads (repositories, certificates, the trace file)."""
        for location in self.options.model_repositories:
            if "://" not in location and not Path(location).is_dir():
                raise StartupError(f"model repository '{location}' is not a folder")
        grpc_tls, http_tls = self.options.grpc_transport.tls, self.options.http_tls
        try:  # before the models load: a missing certificate should not wait for them
            if self.options.allow_grpc and grpc_tls is not None:  # what the chosen server will read
                grpc_tls.credentials() if self.options.grpc_server == "grpcio" else grpc_tls.context()
            if self.options.allow_http and http_tls is not None:
                http_tls.context()
        except TlsFileError as exc:
            raise StartupError(str(exc)) from None
        try:  # before the models load, as the certificates: a trace file that cannot be written
            self.tracer.start()
        except TraceStartupError as exc:
            raise StartupError(str(exc)) from None
        if self.options.openai_port is not None:  # before the models load, as the certificates
            self._openai_type = _openai_frontend_type()

    async def load_models(self) -> None:
        """Loads the models the control mode asks for (`--exit-on-error` applies)."""
        try:  # a repository that cannot be listed stops the start, as in Triton
            await self.repository.start()
        except CoreserveError as exc:
            raise StartupError(exc.message) from None
        self._log_models()
        if self.options.exit_on_error and not self.repository.all_ready(listed_too=True):
            await self.repository.unload_all(timeout=self.options.exit_timeout_secs)
            raise StartupError(
                "some models failed to load (see above); exiting because --exit-on-error is true"
            )

    def _log_models(self) -> None:
        """Triton's start-up tables: the backends, the models, the options."""
        for table in (
            backends_table(self.plugins.backends(), self.options),
            model_status_table(self.repository.models()),
            options_table(
                self.options, self.dataplane.server_metadata()["extensions"], self.response_cache is not None
            ),
        ):
            logger.info("%s", table, extra={"table": True})

    async def open_frontends(self) -> None:
        """Starts the metrics polling and the HTTP, gRPC and metrics frontends the options allow."""
        options, worker = self.options, self.worker
        serves_http = worker is None or worker.index < options.http_workers
        if self.metrics_report is not None:
            self.metrics_report.start()
            if options.open_metrics_port and (worker is None or worker.index == 0):  # the first's
                self.metrics = MetricsFrontend(
                    self.metrics_report, address=options.metrics_address, port=options.metrics_port
                )
                await _start_service("metrics", self.metrics.start())
        if options.allow_grpc and (worker is None or worker.index < options.grpc_workers):
            transport = options.grpc_transport
            if worker is not None:
                transport = dataclasses.replace(transport, reuse_port=True)
            self.grpc = (GrpcFrontend if options.grpc_server == "grpcio" else NativeGrpcFrontend)(
                self.dataplane,
                address=options.grpc_address,
                port=options.grpc_port,
                max_message_size=options.grpc_max_message_size,
                max_stream_inflight=options.grpc_max_stream_inflight,
                restrictions=ApiRestrictions(options.grpc_restricted_api, grpc=True),
                header_forwarding=HeaderForwarding(options.grpc_header_forward_pattern),
                transport=transport,
            )
            await _start_service("gRPC", self.grpc.start())
        if options.allow_http and serves_http:
            self.http = self.http_frontend()
            await _start_service("HTTP", self.http.start())
        if self._openai_type is not None and options.openai_port is not None and serves_http:
            self.openai = self._openai_type(
                self.dataplane,
                self.custom_metrics,
                address=options.openai_address,
                port=options.openai_port,
                max_body_size=options.http_max_input_size,
                limits=options.http_limits,
                shutdown_timeout=options.exit_timeout_secs,
                reuse_port=worker is not None,
            )
            await _start_service("OpenAI", self.openai.start())

    def http_frontend(self) -> HttpFrontend:
        """An HTTP frontend over this server with the options' HTTP settings, not yet listening.

        `open_frontends` starts one; `coreserve.Server.http_bridge` answers with one that never
        listens (Ray Serve's proxy brings the requests).
        """
        options = self.options
        return HttpFrontend(
            self.dataplane,
            address=options.http_address,
            port=options.http_port,
            max_body_size=options.http_max_input_size,
            limits=options.http_limits,
            restrictions=ApiRestrictions(options.http_restricted_api),
            header_forwarding=HeaderForwarding(options.http_header_forward_pattern),
            shutdown_timeout=options.exit_timeout_secs,
            tls=options.http_tls,
            reuse_port=options.http_reuse_port or self.worker is not None,
        )

    async def stop(self) -> None:
        """Stops taking requests, lets those taken finish, then unloads every model. Where
        --exit-timeout-secs cut a request or an instance's close, `stopped_in_time` turns false."""
        self.flags.stopping = True
        logger.info("Waiting for in-flight requests to complete.")  # (Triton's words)
        # As Triton's: a client's request that comes now is refused (the frontends stay up
        # while they drain); those queued and running finish.
        for model in self.repository.models_unordered():
            for version in model.versions.values():
                if version.scheduler is not None:
                    version.scheduler.stopping()
        if self._poller is not None:
            self._poller.cancel()
        self.dataplane.traffic.close()  # rollouts stop moving weights; the weights stay as they are
        # --exit-timeout-secs bounds the whole stop: draining the frontends, then the models.
        timeout = self.options.exit_timeout_secs
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        await asyncio.gather(
            *([self.http.stop()] if self.http is not None else []),
            *([self.openai.stop()] if self.openai is not None else []),
            *([self.grpc.stop(grace=timeout)] if self.grpc is not None else []),
        )
        if self._link is not None:  # worker 0 serves the others' requests until they stop
            await self._link.others_gone(min(OTHERS_STOP_WAIT_S, max(0.0, deadline - loop.time())))
        if not await self.repository.unload_all(timeout=max(0.0, deadline - loop.time())):
            self.stopped_in_time = False  # in Triton's words:
            logger.error("failed to stop server: Internal - Exit timeout expired. Exiting immediately.")
        if self.metrics is not None:
            await self.metrics.stop()
        if self.metrics_report is not None:
            await self.metrics_report.stop()
        self.tracer.close()
        if self._link is not None:
            await self._link.close()
        self._remove_own_cache()
        logger.info("coreserve stopped")

    def _remove_own_cache(self) -> None:
        """Removes the cache folder this server made for itself (never one it was given)."""
        if self._own_cache:
            shutil.rmtree(self.cache_dir, ignore_errors=True)

    async def serve(self) -> None:
        """Starts, serves until SIGINT or SIGTERM, then stops. A signal while the models load
        gives the start up (the loads under way are cancelled) and stops."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        starting = asyncio.create_task(self.start())
        signalled = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({starting, signalled}, return_when=asyncio.FIRST_COMPLETED)
            if not starting.done():
                logger.info("signal received while starting; stopping")
                starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starting  # raises what the start raised
        except BaseException as exc:
            if isinstance(exc, StartupError):  # said before the stop's own lines
                logger.error("%s", exc.message)
            signalled.cancel()
            await self.stop()  # what did start (models, stubs, frontends) stops cleanly
            raise
        try:
            if not signalled.done():
                await signalled
                logger.info("signal received; stopping")
        finally:
            await self.stop()


async def _start_service(name: str, starting: Awaitable[None]) -> None:
    """Starts a frontend; a port that cannot be bound is a start-up error in one line."""
    try:
        await starting
    except (OSError, RuntimeError) as exc:  # asyncio's bind errors; grpc's "Failed to bind to address"
        raise StartupError(f"failed to start {name} service: {exc}") from None


def _openai_frontend_type() -> type[OpenAIFrontend]:
    """The OpenAI frontend's class; without its extra (jinja2), a start-up error in one line."""
    try:
        from coreserve.server.openai import OpenAIFrontend
    except ImportError as exc:
        raise StartupError(
            "--openai-port needs the OpenAI frontend's extra: pip install 'core-server[openai]' (from a "
            f"clone: pip install './core[openai]') ({exc})"
        ) from None
    return OpenAIFrontend
