"""The data plane: what both frontends do, written once.

HTTP and gRPC decode their messages into `InferenceRequest`s and call these methods; every
model-related decision (which version, is it ready, is the request valid) is made here.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any, Protocol, assert_never

from coreserve.config import ModelConfig, ModelSignature
from coreserve.errors import (
    AmbiguousModelError,
    CoreserveError,
    InvalidArgumentError,
    NotFoundError,
    RequestMismatchError,
    UnavailableError,
    UnsupportedError,
    with_request_id,
)
from coreserve.repository import ModelRepository, ModelVersion, parse_load_parameters
from coreserve.repository.model import parse_version
from coreserve.responses import QueuedResponses, SingleResponse
from coreserve.scheduling import stop_refusal
from coreserve.server import _request_log as request_log
from coreserve.server._request_steps import classifying, end_trace, timeout_s
from coreserve.server._statistics_report import statistics_of
from coreserve.server.changes import (
    Change,
    LoadModel,
    RegisterCudaRegion,
    RegisterSystemRegion,
    SetTraffic,
    UnloadModel,
    UnregisterCudaRegion,
    UnregisterSystemRegion,
    UpdateLogSettings,
    UpdateTraceSetting,
)
from coreserve.server.frontend_reads import FRONTEND_READS
from coreserve.server.log_settings import LogSettings, ServerLog
from coreserve.server.shared_memory import CudaSharedMemory, SystemSharedMemory, load_cuda_runtime
from coreserve.server.traffic import RolloutPeers, TrafficControl, TrafficRouter
from coreserve.tracing import Tracer
from coreserve.tracing.trace import TraceEndingSink
from coreserve.types import InferenceRequest, InferenceResponse, ResponseSink, now_ns
from coreserve.version import __version__

SERVER_NAME = "coreserve"
# Exactly the extensions served (Triton's names; tests/e2e/triton/test_shared_memory.py probes each).
EXTENSIONS = (
    "classification", "sequence", "model_repository", "model_repository(unload_dependents)",
    "schedule_policy", "model_configuration", "system_shared_memory", "binary_tensor_data",
    "parameters", "statistics", "generate", "trace", "logging",
)  # fmt: skip


@dataclass
class ServerFlags:
    """The state the health endpoints report."""

    started: bool = False
    stopping: bool = False
    strict_readiness: bool = True
    peers_ready: bool = True  # in a server of several workers: every worker is serving


class NamesModel(Protocol):
    model_name: str
    model_version: str


class Peers(RolloutPeers, Protocol):
    """The other workers of a server of several (`coreserve.server.workers`)."""

    async def everywhere(self, change: Change) -> None:
        """Makes `change` in every worker (`DataPlane.apply_change`), this one too."""

    async def statistics(self, name: str, version: str) -> dict[str, Any]:
        """The statistics of every worker, added up."""


class DataPlane:
    """Health, metadata and inference over the model repository."""

    def __init__(
        self,
        repository: ModelRepository,
        flags: ServerFlags,
        *,
        log: ServerLog | None = None,
        name: str = SERVER_NAME,
        tracer: Tracer | None = None,
    ) -> None:
        self.repository = repository
        self.flags = flags
        self.log = log or ServerLog()
        self.name = name  # --id
        self.shared_memory = SystemSharedMemory()
        runtime = load_cuda_runtime()
        if runtime is not None:  # CUDA shared memory only where a CUDA device is usable
            self.shared_memory.cuda = CudaSharedMemory(runtime)
        self.tracer = tracer or Tracer()
        self.peers: Peers | None = None  # set in a worker of a server of several
        self.traffic = TrafficRouter()
        self.traffic_control = TrafficControl(repository, self.traffic, self)

    def live(self) -> bool:
        return not self.flags.stopping

    def ready(self) -> bool:
        if not self.flags.started or self.flags.stopping or not self.flags.peers_ready:
            return False
        return self.repository.all_ready() if self.flags.strict_readiness else True

    def server_metadata(self) -> dict[str, Any]:
        extensions = list(EXTENSIONS)
        if self.shared_memory.cuda is not None:
            extensions.insert(extensions.index("system_shared_memory") + 1, "cuda_shared_memory")
        return {"name": self.name, "version": __version__, "extensions": extensions}

    def log_settings(self) -> LogSettings:
        return self.log.settings

    async def update_log_settings(self, changes: dict[str, Any]) -> LogSettings:
        """Changes the log settings at run time, all or nothing (see ServerLog.update)."""
        await self.change(UpdateLogSettings(changes))
        return self.log.settings

    def trace_setting(self, model: str = "") -> dict[str, Any]:
        """The trace setting in force for a model ("" for the global one), as Triton answers it."""
        self._check_traced_model(model)
        return self.tracer.answer(model)

    async def update_trace_setting(self, changes: dict[str, Any], model: str = "") -> dict[str, Any]:
        """Changes the global trace setting or a model's, all or nothing (see TraceSettings.update);
        the setting then in force, as Triton answers it."""
        await self.change(UpdateTraceSetting(changes, model))
        return self.tracer.answer(model)

    def _check_traced_model(self, model: str) -> None:
        if model:
            try:
                self.repository.get(model)
            except NotFoundError:
                raise InvalidArgumentError(f"Request for unknown model : {model}") from None

    def model_version(self, name: str, version: str = "") -> ModelVersion:
        """The ready model version a request names; raises NotFound or Unavailable."""
        return self.repository.get(name).version(version)

    async def serving_version(
        self, name: str, version: str = "", timeout: float | None = None
    ) -> ModelVersion:
        """The model version an inference request names, loaded first if the server loads
        models on demand and it is not loaded (waiting at most `timeout` seconds)."""
        return self.in_use(name, version) or await self._on_demand(name, version, timeout)

    def in_use(self, name: str, version: str, request: InferenceRequest | None = None) -> ModelVersion | None:
        """The loaded version a request names (for `request`, one that names no version goes where
        its model's traffic policy sends it), marked used now; None where no such model is loaded
        (the caller then awaits `_on_demand`: a request for a loaded model makes no coroutine)."""
        try:
            model = self.repository.get(name)
            if version or model.traffic is None or request is None:
                target = model.version(version)
            else:
                target = self.traffic.route(model, request)
        except NotFoundError:
            return None
        target.last_used = time.time()
        return target

    async def _on_demand(
        self, name: str, version: str, timeout: float | None, request: InferenceRequest | None = None
    ) -> ModelVersion:
        """After a lookup that found no model: loads it on demand where the server does, and
        looks again as `in_use` does, `request` routed by the policy the load brought (raising
        the lookup's error where it does not load)."""
        if not self.flags.stopping:  # (the stop unloads every model: none starts loading now)
            await self.repository.budgeted.demand(name, timeout)
        return self.in_use(name, version, request) or self._not_in_use(name, version, request)

    def _not_in_use(self, name: str, version: str, request: InferenceRequest | None) -> ModelVersion:
        """Raises the error of a lookup that found no model where none loads now: once the stop
        began, a server that loads models on demand refuses as the stop does."""
        if self.flags.stopping and self.repository.budgeted.on_demand:
            raise UnavailableError(stop_refusal(request.id if request is not None else ""))
        return self.model_version(name, version)

    async def load_on_demand(self, request: NamesModel) -> None:
        """Loads the model of a stream's request on demand, before it is submitted (the stream's
        next requests wait: their order stays); a failure is the request's own lookup's to say."""
        name, version = request.model_name, request.model_version
        if self.repository.budgeted.on_demand and self.in_use(name, version) is None:
            with contextlib.suppress(CoreserveError):
                await self._on_demand(name, version, None)

    def model_signature(self, name: str, version: str = "") -> ModelSignature:
        return self.model_version(name, version).signature

    def model_ready(self, name: str, version: str = "") -> bool:
        """Whether the model version serves: loaded, and an instance of it is running (false
        while its only instances restart, though requests still queue for it)."""
        try:
            return self.model_version(name, version).ready
        except (NotFoundError, UnavailableError, AmbiguousModelError):
            return False  # as Triton (a name two repositories hold too); a malformed version is an error

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        model = self.repository.get(name)
        chosen = model.version(version)
        signature = chosen.signature
        return {
            "name": name,
            "versions": [str(v) for v in ([parse_version(version)] if version else model.serving_versions())],
            "platform": chosen.config.platform or chosen.config.backend,
            "inputs": [
                {"name": s.name, "datatype": s.datatype.value, "shape": signature.client_shape(s)}
                for s in signature.inputs.values()
            ],
            "outputs": [
                {"name": s.name, "datatype": s.datatype.value, "shape": signature.client_shape(s)}
                for s in signature.outputs.values()
            ],
        }

    def model_config(self, name: str, version: str = "") -> ModelConfig:
        """The configuration of a model that serves (NOT_FOUND / UNAVAILABLE otherwise, as Triton)."""
        model = self.repository.get(name)
        chosen = model.version(version)
        return model.config if not version and model.config is not None else chosen.config

    def submit(self, request: InferenceRequest, sink: ResponseSink) -> None:
        """Checks a request against the model and schedules it; `sink` gets its responses.

        Raises when the request does not fit; as on Triton, such a request is not counted in the
        model's statistics (it never reached the model).
        """
        name, version = request.model_name, request.model_version
        target = self.in_use(name, version, request) or self._not_in_use(name, version, request)
        self._submit(target, request, self._watched(sink, request, target), True)

    def _watched(self, sink: ResponseSink, request: InferenceRequest, target: ModelVersion) -> ResponseSink:
        """`sink`, or where the request was routed, the sink its model's traffic policy watches
        (a shadow copy, a rollout's count: TrafficRouter.watched)."""
        if not request.routed:
            return sink
        policy = self.repository.get(request.model_name).traffic  # (a dict lookup)
        return self.traffic.watched(sink, request, target, policy, self.submit)

    def _submit(
        self,
        model_version: ModelVersion,
        request: InferenceRequest,
        sink: ResponseSink,
        ends_trace: bool = False,
    ) -> None:
        """`ends_trace`: the sink ends a traced request's trace (infer ends it itself)."""
        scheduler = model_version.scheduler
        if scheduler is None:
            raise UnavailableError(
                f"Request for unknown model: '{request.model_name}' version {model_version.version} "
                "is not at ready state"
            )
        try:
            model_version.signature.check_request(request)
            if request.class_counts:
                sink = classifying(model_version, request.class_counts, sink)
        except CoreserveError as exc:
            if isinstance(exc, RequestMismatchError):
                raise RequestMismatchError(with_request_id(request.id, exc.message)) from None
            raise
        request.sink = sink
        if self.tracer.active:
            request.trace = self.tracer.trace(request, model_version.version)
            if ends_trace and request.trace is not None:
                request.sink = TraceEndingSink(request.trace, sink)
        level = self.log.settings.log_verbose_level
        if level:
            request_log.received(request, model_version.version, level)
        scheduler.submit(request)

    async def infer(
        self,
        request: InferenceRequest,
        *,
        endpoint: str = "this call",
        instead: str = "the generate_stream endpoint or a gRPC stream",
    ) -> InferenceResponse:
        """Schedules a request that has one response and waits for it.

        `endpoint` names the caller in the refusal of a decoupled model, as Triton words it
        ("HTTP end point", "ModelInfer RPC"); `instead` says what serves such a model there.
        """
        name, version = request.model_name, request.model_version
        target = self.in_use(name, version, request) or await self._on_demand(
            name, version, timeout_s(request), request
        )
        if target.config.model_transaction_policy.decoupled:
            raise UnsupportedError(
                f"{endpoint} doesn't support models with decoupled transaction policy: model "
                f"'{request.model_name}' may send many responses per request; call it with "
                f"{instead}"
            )
        sink = SingleResponse(asyncio.get_running_loop())
        self._submit(target, request, self._watched(sink, request, target))
        try:
            response = await sink.future
        except asyncio.CancelledError:  # its caller was cancelled (a gRPC deadline or cancel, a BLS parent)
            request.cancel()
            raise
        except CoreserveError as exc:
            if request.trace is not None:
                end_trace(request, None, finish=True)
            if self.log.settings.log_verbose_level:
                request_log.failed(request, target.version, exc.message)
            raise
        if request.trace is not None:
            end_trace(request, response, finish=False)
        if self.log.settings.log_verbose_level:
            request_log.answered(request, target.version)
        return response

    async def stream(
        self, request: InferenceRequest, *, frontend_sends: bool = False, max_waiting_bytes: int | None = None
    ) -> AsyncGenerator[InferenceResponse, None]:
        """Schedules a request and yields each of its responses (one for ordinary models).

        `frontend_sends`: the caller marks its sending of the responses on a traced request's
        trace and then finishes it (as infer's callers do); otherwise the trace ends with the
        last response. `max_waiting_bytes`: a network client's bound (see QueuedResponses).
        """
        sink = await self._stream_submitted(request, max_waiting_bytes, ends_trace=not frontend_sends)
        trace = request.trace if frontend_sends else None
        try:
            async for response in sink.responses():
                if trace is not None:
                    trace.outputs(response.outputs)
                    if sink.drained:  # the last one: the request is answered
                        trace.request_end(now_ns())
                        trace = None
                yield response
        finally:
            # Ended by an error or by a final flag without a response (not by a caller that left).
            if trace is not None and sink.drained:
                trace.request_end(now_ns())
            if not sink.done:  # left before the last response (cancelled, or stopped reading)
                request.cancel()

    async def stream_with_flags(
        self, request: InferenceRequest
    ) -> AsyncGenerator[tuple[InferenceResponse | None, bool], None]:
        """`stream`, each response with whether it carried the final flag; a final flag sent
        alone comes as (None, True): what a BLS call tells apart, as Triton's does."""
        sink = await self._stream_submitted(request, None, ends_trace=True)
        try:
            async for flagged in sink.flagged():
                yield flagged
        finally:
            if not sink.done:  # left before the last response (cancelled, or stopped reading)
                request.cancel()

    async def _stream_submitted(
        self, request: InferenceRequest, max_waiting_bytes: int | None, ends_trace: bool
    ) -> QueuedResponses:
        """Submits a request (loaded on demand first where the server does) for a stream."""
        sink = QueuedResponses(max_waiting_bytes, on_overflow=request.cancel)
        name, version = request.model_name, request.model_version
        target = self.in_use(name, version, request) or await self._on_demand(
            name, version, timeout_s(request), request
        )
        self._submit(target, request, self._watched(sink, request, target), ends_trace=ends_trace)
        return sink

    def pending_requests(self) -> int:
        """Requests queued or executing in every model version (more than Triton's pending
        count, which leaves out those executing)."""
        return sum(model.in_flight() for model in self.repository.models_unordered())

    def frontend_reads(self) -> int:
        """How many times the HTTP and gRPC frontends have read a client's bytes (ServerActivity)."""
        return FRONTEND_READS.value

    def statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        """Statistics of every model, of one model's versions, or of one version."""
        return statistics_of(self.repository, name, version)

    async def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Every model and version with its state and, when not ready, the reason (and its rollout)."""
        return await self.traffic_control.with_rollouts(await self.repository.index(ready_only))

    async def load_model(self, name: str, parameters: dict[str, object]) -> None:
        """Loads or reloads a model; `parameters` as Triton's load request carries them."""
        await self.change(LoadModel(name, parameters))

    async def unload_model(self, name: str, dependents: bool = False) -> None:
        await self.change(UnloadModel(name, dependents))

    async def server_statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        """`statistics`, of every worker added up in a server of several."""
        if self.peers is not None:
            return await self.peers.statistics(name, version)
        return self.statistics(name, version)

    async def change(self, change: Change) -> None:
        """A change a client asks of the server (`apply_change`): made here, or in every worker
        of a server of several, so that the server stays one to its clients."""
        if self.peers is not None:
            await self.peers.everywhere(change)
        else:
            await self.apply_change(change)

    async def apply_change(self, change: Change) -> None:
        """Makes `change` in this process."""
        regions = self.shared_memory
        match change:
            case LoadModel(name, parameters, by_model):
                await self.repository.load(name, parse_load_parameters(name, parameters), by_model)
            case UnloadModel(name, dependents, by_model):
                await self.repository.unload(name, dependents, by_model)
            case RegisterSystemRegion(name, key, offset, byte_size):
                regions.register(name, key, offset, byte_size)
            case UnregisterSystemRegion(name):
                regions.unregister(name)
            case RegisterCudaRegion(name, raw_handle, device_id, byte_size):
                regions.register_cuda(name, raw_handle, device_id, byte_size)
            case UnregisterCudaRegion(name):
                if regions.cuda is not None:  # unknown names are no error, as in Triton
                    regions.cuda.unregister(name)
            case UpdateLogSettings(changes):
                self.log.update(changes)
            case UpdateTraceSetting(changes, model):
                self._check_traced_model(model)
                self.tracer.update(changes, model)
            case SetTraffic():
                self.traffic_control.apply(change)
            case _:
                assert_never(change)
