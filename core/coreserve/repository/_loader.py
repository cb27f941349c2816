"""Loading one model: configuration, backend choice, auto-complete, validation, instances."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from coreserve.backend.api import (
    Backend,
    InferenceClient,
    LoadStopper,
    ModelControl,
    ModelFiles,
    ModelInstance,
    ServerActivity,
    ServerContext,
)
from coreserve.backend.custom_metrics import CustomMetrics
from coreserve.backend.devices import reported_gpus
from coreserve.backend.plugins.registry import BackendRegistry
from coreserve.backend.python_based import PYTHON_BACKEND, PYTHON_RUNTIME, python_based_runtime
from coreserve.config import ModelSignature, apply_defaults, read_config_file, validate_config
from coreserve.config.ignored import ineffective_settings
from coreserve.config.instance_groups import depends_on_gpus
from coreserve.ensemble import steps_decoupled
from coreserve.errors import CoreserveError, ModelConfigError
from coreserve.protos.model_config_pb2 import ModelConfig
from coreserve.repository._instances import (
    create_instances,
    grouped_placements,
    instance_key,
    plan_instance_changes,
    single_copy_reason,
    unchanged_versions,
)
from coreserve.repository._layout import (
    CONFIG_FILENAME,
    LabelLookup,
    ModelLocation,
    list_versions,
    read_output_labels,
    select_versions,
    shared_files_fingerprint,
)
from coreserve.repository._overrides import LoadOverrides
from coreserve.repository._warmup import run_warmups
from coreserve.repository.model import Model, ModelState, ModelVersion
from coreserve.repository.namespaces import NamespacedClient, step_lookup
from coreserve.repository.traffic.policy import policy_from_config
from coreserve.scheduling import LatencyOptions, ModelStatistics, Scheduler, close_instances, make_scheduler
from coreserve.scheduling.cache.key import version_fingerprint
from coreserve.scheduling.cache.responses import ModelResponseCache, ResponseCache
from coreserve.scheduling.rate_limiter import InstanceSlot, RateLimiter

logger = logging.getLogger(__name__)


class ModelLoader:
    """Turns a model folder into a `Model` whose versions are ready or say why not."""

    def __init__(
        self,
        backends: BackendRegistry,
        *,
        auto_complete: bool = True,
        backend_config: Mapping[str, Mapping[str, str]] | None = None,
        config_name: str = "",
        load_retries: int = 0,
        latency: LatencyOptions | None = None,
        response_cache: ResponseCache | None = None,
        rate_limiter: RateLimiter | None = None,
        backend_directory: Path | None = None,
    ) -> None:
        self._backends = backends
        self.rate_limiter = rate_limiter  # --rate-limit=execution_count
        self.response_cache = response_cache  # --cache-config; models opt in with response_cache
        self.config_name = config_name  # --model-config-name
        self.load_retries = load_retries  # --model-load-retry-count
        self._stopped = False  # `stop_loads` was called
        self._auto_complete = auto_complete
        self.backend_directory = backend_directory  # where Python-based backends are (None: nowhere)
        self._backend_config = backend_config or {}
        self._latency = latency
        self.client: InferenceClient | None = None  # the server sets its data plane here
        self.models: ModelControl | None = None  # and here, for backends that load models
        self.activity: ServerActivity | None = None  # and here: how busy the server is
        self.metrics = CustomMetrics()  # the custom metric families the metrics endpoint writes
        self.has_model: Callable[[str], bool] | None = None  # namespacing: whether a key is held
        self.labels_of: LabelLookup | None = None  # the server's: a loaded version's output labels
        self.workers = 1  # the worker processes of the server, each with its copies of the models
        # In a worker but the first: what sends a single-copy model's requests to the first.
        self.forwarding: Callable[[ModelVersion], Scheduler] | None = None

    def stop_loads(self) -> None:
        """Has each backend's own work for loads stop (`LoadStopper`); no failed load is retried."""
        self._stopped = True
        for backend in self._backends:
            if isinstance(backend, LoadStopper):
                backend.stop_loads()

    def client_for(self, backend_name: str, namespace: str = "") -> InferenceClient | None:
        """The client a model's instances call the server with: under namespacing an ensemble's
        steps resolve in its own repository first; other backends' calls (BLS) name models
        globally, as Triton's do."""
        client = self.client
        if namespace and backend_name == "ensemble" and client is not None and self.has_model is not None:
            client = NamespacedClient(client, namespace, self.has_model)
        return client

    def context_for(self, backend: Backend, namespace: str = "", copies: int = 1) -> ServerContext:
        return ServerContext(
            backend_config=dict(self._backend_config.get(backend.name, {})),
            logger=logging.getLogger(f"coreserve.backend.{backend.name}"),
            client=self.client_for(backend.name, namespace),
            models=self.models,
            metrics=self.metrics,
            activity=self.activity,
            copies=copies,
        )

    def _latency_for(self, config: ModelConfig) -> LatencyOptions:
        """The latency options with the histogram buckets the model's `model_metrics` sets."""
        return (self._latency or LatencyOptions()).for_config(config)

    async def load(
        self,
        location: ModelLocation,
        overrides: LoadOverrides,
        served: Model | None = None,
    ) -> Model:
        """Loads a model folder with what the load request replaces (`overrides`); never raises:
        a model that cannot load comes back with its reason.

        A version of `served`, the model this load replaces, whose files and configuration (but
        for the version policy and the instance groups) are unchanged is not loaded again: it
        keeps serving, its statistics too, its instances changed in place where the instance
        groups changed and the traffic policy holds, as in Triton; the new model lists it in `kept`.
        """
        model = Model(location.name, location.path, namespace=location.namespace)
        model.from_files = location.from_files
        progress = asyncio.create_task(_report_progress(location.name))
        try:
            try:
                backend, config, chosen = await self._prepare(location, overrides.config, overrides.versions)
                versions = list(overrides.versions) if overrides.versions is not None else chosen
                model.traffic = policy_from_config(config)
                if model.traffic is not None:
                    model.traffic.check_versions(location.name, versions)
            except CoreserveError as exc:
                model.reason = exc.message
                logger.error("model '%s' is unavailable: %s", location.name, model.reason)
                return model
            model.config = config
            model.shared_files_fingerprint = await asyncio.to_thread(shared_files_fingerprint, location.path)
            kept = await unchanged_versions(location, model, versions, served)
            model.versions.update(kept)
            signature = ModelSignature(config)
            loading = [number for number in versions if number not in kept]
            for number in loading:
                model.versions[number] = self._new_version(location, number, config, signature)
            await asyncio.gather(*(self._load_version(backend, location, model.versions[n]) for n in loading))
            # A load that fails (a version, the traffic policy) leaves the kept instances as they were.
            loaded = all(model.versions[number].takes_requests for number in loading)
            if loaded and model.keep_traffic_of(served, overrides.traffic):
                for number, version in list(kept.items()):
                    if not await self._change_instances(backend, location, version, config):
                        del kept[number]  # it loads again, and says why it cannot
                        model.versions[number] = self._new_version(location, number, config, signature)
                        await self._load_version(backend, location, model.versions[number])
            model.kept = frozenset(kept)
            if model.takes_requests and not model.reason:  # (Triton's words, once a load; `reason`: refused)
                logger.info("successfully loaded '%s'", location.name)
            else:  # (after each version's reason)
                logger.info("failed to load '%s'", location.name)
            return model
        finally:
            progress.cancel()

    async def _prepare(
        self, location: ModelLocation, config: ModelConfig | None, versions: Sequence[int] | None = None
    ) -> tuple[Backend, ModelConfig, list[int]]:
        """The backend, the completed configuration and the versions to load; the files looked
        at are the newest version's, of those `versions` where given (not one added since)."""
        config_path = location.config_path
        if config is None:
            config = read_config_file(config_path) if config_path.exists() else ModelConfig()
        else:
            config, given = ModelConfig(), config
            config.CopyFrom(given)
        available = list_versions(location.path)
        newest = max(versions) if versions else (available[-1] if available else None)
        # What Triton fills in before a backend completes the configuration (its name, backend
        # and version policy), so that the backend's completion reads them there.
        config.name = config.name or location.name
        backend = self._choose_backend(location, config, newest)
        if not config.default_model_filename and config.runtime != PYTHON_RUNTIME:  # (a Python-based
            config.default_model_filename = backend.default_model_filename  # backend's stays "")
        if not config.HasField("ensemble_scheduling"):
            config.backend = config.backend or backend.name
        if config.version_policy.WhichOneof("policy_choice") is None:
            config.version_policy.latest.num_versions = 1
        if self._auto_complete and newest is not None:
            files = self._files(location, newest, config)
            config = await asyncio.to_thread(
                backend.auto_complete_config, files, config, self.context_for(backend)
            )
        if not config.HasField("ensemble_scheduling"):  # (an ensemble's is "", as Triton shows it)
            config.backend = config.backend or backend.name  # (a completion may have emptied it)
        client = self.context_for(backend, location.namespace).client
        # Triton's core, not its ensemble backend, sets this, with or without completion (the
        # steps serve already: they load first).
        # (Not over a flag written with a response cache: Triton refuses that pair as written.)
        policy = config.model_transaction_policy
        if config.HasField("ensemble_scheduling") and client is not None:
            decoupled = steps_decoupled(config, client.model_signature)
            if decoupled is not None and not (policy.decoupled and config.response_cache.enable):
                policy.decoupled = decoupled
        if not config.platform and backend.platforms:
            config.platform = backend.platforms[0]
        # Where instances may run is the backend's to say (it may start CUDA to count GPUs).
        gpus = await asyncio.to_thread(reported_gpus, backend) if depends_on_gpus(config) else None
        apply_defaults(config, location.name, gpus, getattr(backend, "default_cpu_instance_count", 1))
        validate_config(config)
        single_copy_reason(config)  # a malformed coreserve_single_copy fails the load here
        cached, limited = self.response_cache is not None, self.rate_limiter is not None
        for reason in ineffective_settings(config, response_cache=cached, rate_limiter=limited):
            logger.warning("model '%s': %s", config.name, reason)
        versions = select_versions(config.version_policy, available, location.name)
        if not versions:
            raise ModelConfigError(
                f"model '{location.name}' has no version folder to serve (numeric subfolders such as "
                f"{location.path / '1'}); found {available or 'none'}"
            )
        return backend, config, versions

    def _choose_backend(self, location: ModelLocation, config: ModelConfig, newest: int | None) -> Backend:
        if config.backend or config.platform:
            try:
                has_backend = self._backends.get(config.backend) is not None
                runtime = python_based_runtime(config, self.backend_directory, has_backend)
                if runtime is not None:
                    backend = self._backends.require(name=PYTHON_BACKEND)
                    logger.info(
                        "model '%s': Python-based backend '%s' runs %s", config.name, config.backend, runtime
                    )
                    return backend
                return self._backends.require(name=config.backend, platform=config.platform)
            except CoreserveError as exc:
                raise ModelConfigError(f"model '{location.name}': {exc.message}") from None
        # No backend named: take the one whose kind of model file the newest version holds.
        candidates = []
        if newest is not None:
            version_path = location.path / str(newest)
            for backend in self._backends:
                if not backend.default_model_filename:
                    continue  # a backend without model files (ensemble) is only chosen by name
                filename = config.default_model_filename or backend.default_model_filename
                same_kind = Path(filename).suffix == Path(backend.default_model_filename).suffix
                if same_kind and (version_path / filename).exists():
                    candidates.append(backend)
        if len(candidates) == 1:
            return candidates[0]
        installed = ", ".join(self._backends.names()) or "none"
        raise ModelConfigError(
            f"model '{location.name}': cannot tell which backend serves it; set 'backend' or 'platform' "
            f"in {CONFIG_FILENAME} (installed backends: {installed})"
        )

    async def _change_instances(
        self, backend: Backend, location: ModelLocation, version: ModelVersion, config: ModelConfig
    ) -> bool:
        """Gives a version that a reload keeps the instances `config` asks for, in place, as
        Triton: alike instances stay, the new ones are created (and warmed up) while the others
        serve, then those left over end their batch (their sequences, under sequence batching) and
        are closed. False (none added) where a new instance cannot be created, warmed up or rate-limited."""
        scheduler = version.scheduler
        assert scheduler is not None
        grouped = grouped_placements(config)
        kept, wanted, retired = plan_instance_changes(version.placed, grouped)
        if not wanted and not retired:
            return True
        created: list[ModelInstance] = []
        slots: list[InstanceSlot] = []
        try:
            files = self._files(location, version.version, config)
            context = self.context_for(
                backend, location.namespace, 1 if single_copy_reason(config) else self.workers
            )
            created = await create_instances(backend, files, config, [p for _, p in wanted], context)
            if self.rate_limiter is not None:
                needs = [(group.rate_limiter, placement.device_id) for group, placement in wanted]
                slots = self.rate_limiter.register(location.name, needs, config.optimization.priority)
            if config.model_warmup:
                named = [
                    (instance, placement.name)
                    for instance, (_, placement) in zip(created, wanted, strict=True)
                ]
                await run_warmups(version, location.path, named, self._scratch_statistics(version))
        except BaseException as exc:
            if self.rate_limiter is not None:
                self.rate_limiter.unregister(slots)
            await asyncio.shield(close_instances(created, None, location.name))
            if not isinstance(exc, Exception):  # (the load is cancelled)
                raise
            reason = exc.message if isinstance(exc, CoreserveError) else f"{type(exc).__name__}: {exc}"
            logger.warning(
                "model '%s' version %d: its instances cannot change in place (%s); it loads again",
                location.name,
                version.version,
                reason,
            )
            return False
        if scheduler.closed:  # (the server stopped meanwhile: the version is unloaded)
            if self.rate_limiter is not None:
                self.rate_limiter.unregister(slots)
            await close_instances(created, None, location.name)
            return True
        scheduler.add_instances(created, slots)
        version.placed = kept + [
            (instance_key(*pair), instance) for pair, instance in zip(wanted, created, strict=True)
        ]
        # Cancelled meanwhile (the server stops), the load must not cut the requests they run.
        await asyncio.shield(scheduler.retire_instances(retired))
        logger.info(
            "model '%s' version %d: %d instance(s) added and %d retired in place (instance_group changed)",
            location.name,
            version.version,
            len(created),
            len(retired),
        )
        return True

    def _new_version(
        self, location: ModelLocation, number: int, config: ModelConfig, signature: ModelSignature
    ) -> ModelVersion:
        ensemble = config.HasField("ensemble_scheduling")
        statistics = ModelStatistics(location.name, number, self._latency_for(config), ensemble)
        return ModelVersion(location.name, number, config, signature, statistics)

    def _scratch_statistics(self, version: ModelVersion) -> ModelStatistics:
        """Where warmup samples are counted: statistics count what clients sent, not those."""
        return ModelStatistics(version.name, version.version, self._latency_for(version.config))

    def _files(self, location: ModelLocation, version: int, config: ModelConfig) -> ModelFiles:
        """Where a version's files lie; the runtime of a Python-based backend's model too."""
        runtime = python_based_runtime(config, self.backend_directory, True)
        return ModelFiles(location.name, location.path, version, config.default_model_filename, runtime)

    async def _load_version(self, backend: Backend, location: ModelLocation, version: ModelVersion) -> None:
        """Loads a version; one that fails is loaded again at once, up to `load_retries` times
        (Triton's --model-load-retry-count), each failure logged with its reason."""
        for attempt in range(max(0, self.load_retries) + 1):
            if attempt and self._stopped:  # (the server stops: a failure then is not tried again)
                return
            version.state, version.reason, version.placed = ModelState.LOADING, "", []
            if await self._try_load_version(backend, location, version):
                return

    async def _try_load_version(
        self, backend: Backend, location: ModelLocation, version: ModelVersion
    ) -> bool:
        files = self._files(location, version.version, version.config)
        started = time.monotonic()
        instances: list[ModelInstance] = []
        try:
            if not files.version_path.is_dir():
                raise ModelConfigError(f"model '{location.name}' has no folder for version {version.version}")
            step_labels = step_lookup(self.labels_of, location.namespace, self.has_model)
            version.labels = read_output_labels(version.config, location.path, step_labels)
            single = single_copy_reason(version.config)
            if self.forwarding is not None and single:
                version.scheduler = self.forwarding(version)
                version.scheduler.start()
                version.state = ModelState.READY
                logger.info(
                    "model '%s' version %d is served by worker 0 for every worker (%s)",
                    location.name,
                    version.version,
                    single,
                )
                return True
            # Of the files it loads (a version worker 0 serves for this worker loads none), by path
            # and size where they are this server's copy (its times differ from another's).
            version.files_fingerprint = await asyncio.to_thread(
                version_fingerprint, location.path, version.version, "", times=not location.copied
            )
            copies = 1 if single else self.workers
            context = self.context_for(backend, location.namespace, copies)
            grouped = grouped_placements(version.config)
            placements = [placement for _, placement in grouped]
            instances = await create_instances(backend, files, version.config, placements, context)
            version.scheduler = make_scheduler(
                version.config, version.signature, version.statistics, instances, location.path
            )
            # An ensemble only waits on its steps, which take their own turns.
            if self.rate_limiter is not None and not version.config.HasField("ensemble_scheduling"):
                slots = self.rate_limiter.register(
                    location.name,
                    [(group.rate_limiter, placement.device_id) for group, placement in grouped],
                    version.config.optimization.priority,
                )
                version.scheduler.limit_rate(self.rate_limiter, slots)
            version.placed = [
                (instance_key(*pair), instance) for pair, instance in zip(grouped, instances, strict=True)
            ]
            version.scheduler.start()
            if version.config.model_warmup:
                named = [
                    (instance, placement.name)
                    for instance, placement in zip(instances, placements, strict=True)
                ]
                await run_warmups(version, location.path, named, self._scratch_statistics(version))
            if version.config.response_cache.enable and self.response_cache is not None:
                # A cache other processes share knows the version by its files, not by this load.
                fingerprint = (
                    version_fingerprint(location.path, version.version, str(version.config))
                    if self.response_cache.shared
                    else ""
                )
                version.scheduler.response_cache = ModelResponseCache(
                    self.response_cache, location.name, version.version, fingerprint
                )
        except Exception as exc:
            if version.scheduler is not None:
                await version.scheduler.close()  # nothing is queued yet; closes (finalizes) the instances
                version.scheduler = None
            else:
                await close_instances(instances, None, location.name)
            version.state = ModelState.UNAVAILABLE
            version.reason = (
                exc.message if isinstance(exc, CoreserveError) else f"{type(exc).__name__}: {exc}"
            )
            logger.error(  # (Triton's words)
                "failed to load '%s' version %d: %s", location.name, version.version, version.reason
            )
            return False
        version.load_seconds = time.monotonic() - started
        version.state = ModelState.READY
        return True


async def _report_progress(name: str, every: float = 5.0) -> None:
    """Logs now and then while a model takes long to load, so an operator sees it is alive."""
    started = time.monotonic()
    while True:
        await asyncio.sleep(every)
        logger.info("model '%s' is still loading (%.0f s so far)", name, time.monotonic() - started)
