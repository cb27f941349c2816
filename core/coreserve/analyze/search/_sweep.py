"""One settings measured: loaded into the server, then swept over client concurrency.

The composing models (an ensemble's steps, a BLS model's callees) are loaded first with their
instance counts, then the model itself with its own settings (an ensemble has none).

Points already in the checkpoint are taken from it, and the server is asked to load the
settings only when a point is missing, so a resumed analysis skips what it measured.
"""

from __future__ import annotations

from collections.abc import Callable

from coreserve.analyze._points import CLIENT_BATCH_SIZE, Measurement, ModelSettings, with_instance_count
from coreserve.analyze._ranking import Constraints
from coreserve.analyze.measure._callers import Caller, GrpcCaller, HttpCaller
from coreserve.analyze.measure._client import LoadFailed, ServerClient
from coreserve.analyze.measure._gpu_metrics import GpuMetrics
from coreserve.analyze.measure._load import Windows, measure
from coreserve.analyze.measure._perf_analyzer import measure_with_perf_analyzer
from coreserve.analyze.measure._server_process import Usage
from coreserve.analyze.search._checkpoint import Checkpoint
from coreserve.analyze.search._progress import Progress
from coreserve.analyze.search._strategy import SearchSpace, concurrency_levels, keep_going
from coreserve.protos import grpc_service_pb2 as pb
from coreserve.protos.model_config_pb2 import ModelConfig

LOAD_FAILED_LEVEL = 0  # the concurrency a failed load is recorded at


class Sweep:
    def __init__(
        self,
        client: ServerClient,
        model: str,
        base_config: ModelConfig,
        space: SearchSpace,
        constraints: Constraints,
        windows: Windows,
        checkpoint: Checkpoint,
        progress: Progress,
        usage: Callable[[], Usage] | None,
        reconfigure: bool = True,
        composing_configs: dict[str, ModelConfig] | None = None,
        http_address: str | None = None,
        perf_analyzer: str | None = None,
        gpus: GpuMetrics | None = None,
    ) -> None:
        self.client = client
        self.model = model
        self.base_config = base_config
        self.space = space
        self.constraints = constraints
        self.windows = windows
        self.checkpoint = checkpoint
        self.progress = progress
        self.usage = usage
        self.reconfigure = reconfigure  # False against a server we did not start: measure it as it is
        self.composing_configs = composing_configs or {}
        self.http_address = http_address  # the load goes over HTTP there; else over gRPC
        self._caller: Caller | None = None
        self._request: pb.ModelInferRequest | None = None  # a request for the settings loaded
        self.perf_analyzer = perf_analyzer  # the binary measuring instead of our callers, if any
        self.gpus = gpus  # the server's GPU metrics, where it has GPUs
        self._loaded: ModelSettings | None = None
        self._evaluated: dict[ModelSettings, list[Measurement]] = {}

    async def evaluate(self, settings: ModelSettings) -> list[Measurement]:
        """The settings' load levels: measured, or read from the checkpoint; a settings asked
        for again in this run (the climb starts where the command's first one did) is answered
        from memory, without a second progress line."""
        if settings not in self._evaluated:
            self._evaluated[settings] = await self._evaluate(settings)
        return self._evaluated[settings]

    async def _evaluate(self, settings: ModelSettings) -> list[Measurement]:
        failed = self.checkpoint.get(settings, LOAD_FAILED_LEVEL)
        if failed is not None:
            self.progress.measured(failed, resumed=True)
            self.progress.settings_finished()
            return [failed]
        measured: list[Measurement] = []
        for level in concurrency_levels(self.space):
            point = self.checkpoint.get(settings, level)
            if point is not None:
                self.progress.measured(point, resumed=True)
            else:
                try:
                    point = await self._measure(settings, level)
                except LoadFailed as exc:
                    point = Measurement(settings, LOAD_FAILED_LEVEL, error=f"failed to load: {exc}")
                    self.checkpoint.add(point)
                    self.progress.measured(point)
                    self.progress.settings_finished()
                    return [point]
                self.checkpoint.add(point)
                self.progress.measured(point)
            measured.append(point)
            if not keep_going(measured, self.constraints):
                break
        self.progress.settings_finished()
        return measured

    async def _measure(self, settings: ModelSettings, concurrency: int) -> Measurement:
        request = self._request
        if await self._configure(settings) or request is None:
            await self.close()
            request = self._request = await self.client.infer_request(self.model, CLIENT_BATCH_SIZE)
        if self.perf_analyzer is not None:
            return await self._measure_with_perf_analyzer(self.perf_analyzer, settings, concurrency, request)
        if self._caller is None:
            self._caller = self._new_caller(request)
        return await measure(
            self.client,
            self._caller,
            self.model,
            settings,
            concurrency,
            self.windows,
            self.usage,
            CLIENT_BATCH_SIZE,
            self.gpus,
        )

    async def _measure_with_perf_analyzer(
        self, binary: str, settings: ModelSettings, concurrency: int, request: pb.ModelInferRequest
    ) -> Measurement:
        url, protocol = (self.http_address, "http") if self.http_address else (self.client.address, "grpc")
        batched = settings.max_batch_size > 0  # perf_analyzer's shapes leave the batch dimension out
        shapes = {tensor.name: list(tensor.shape[1 if batched else 0 :]) for tensor in request.inputs}
        return await measure_with_perf_analyzer(
            binary, self.client, url, protocol, self.model, settings, concurrency,
            self.windows, shapes, self.usage, self.gpus,
        )  # fmt: skip

    async def _configure(self, settings: ModelSettings) -> bool:
        """Loads `settings` unless they are what the server has; True where they were loaded.
        The composing models go first, with their counts; then the model with its own settings."""
        if self._loaded == settings:
            return False
        self._loaded = None
        if self.reconfigure:
            for name, count in settings.composing:
                await self.client.load(name, with_instance_count(self.composing_configs[name], count))
            if settings.own_settings:
                await self.client.load(self.model, settings.applied_to(self.base_config))
        self._loaded = settings
        return True

    def _new_caller(self, request: pb.ModelInferRequest) -> Caller:
        if self.http_address is not None:
            return HttpCaller(self.http_address, request)
        return GrpcCaller(self.client, request)

    async def close(self) -> None:
        self._request = None
        if self._caller is not None:
            await self._caller.close()
            self._caller = None
