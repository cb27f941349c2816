"""What a backend implements, and what the server hands it."""

from __future__ import annotations

import enum
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from coreserve.backend.custom_metrics import CustomMetrics
from coreserve.config.signature import ModelSignature
from coreserve.protos.model_config_pb2 import ModelConfig
from coreserve.types import InferenceRequest, InferenceResponse

if TYPE_CHECKING:
    from coreserve.backend.responder import Responder


@dataclass(frozen=True, slots=True)
class ModelFiles:
    """Where one version of a model lies on disk.

    `model_file` is the version folder joined with the configuration's
    `default_model_filename`, or with the backend's default file name; for a model of a
    Python-based backend (see `coreserve.backend.python_based`), it is that backend's `runtime`.
    """

    name: str
    path: Path
    version: int
    filename: str
    runtime: Path | None = None

    @property
    def version_path(self) -> Path:
        return self.path / str(self.version)

    @property
    def model_file(self) -> Path:
        return self.runtime if self.runtime is not None else self.version_path / self.filename


class InstanceKind(enum.StrEnum):
    CPU = "CPU"
    GPU = "GPU"
    MODEL = "MODEL"


@dataclass(frozen=True, slots=True)
class InstancePlacement:
    """One instance of an `instance_group` entry: its name, kind and device."""

    name: str
    group_name: str
    index: int
    kind: InstanceKind
    device_id: int = 0


class InferenceClient(Protocol):
    """The server's in-process inference client: requests go through the target model's
    scheduler (so its batching applies), exactly as requests from the network do."""

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        """Runs a request that has one response and returns it; raises a CoreserveError."""
        ...

    def stream(self, request: InferenceRequest) -> AsyncIterator[InferenceResponse]:
        """Runs a request and yields its responses (many, for a decoupled model). A decoupled
        model's response may carry an error (`response.error`) and more may follow it; an
        error that ends the request is raised."""
        ...

    def stream_with_flags(
        self, request: InferenceRequest
    ) -> AsyncIterator[tuple[InferenceResponse | None, bool]]:
        """`stream`, each response with whether it carried the final flag; a final flag sent
        alone comes as (None, True) (Triton's BLS tells the two apart)."""
        ...

    def model_signature(self, name: str, version: str = "") -> ModelSignature:
        """The inputs and outputs of a ready model version; raises NotFound or Unavailable."""
        ...


class ModelControl(Protocol):
    """The server's model repository API, for backends whose models manage other models
    (Triton's `pb_utils.load_model`). Loading and unloading work only under
    `--model-control-mode=explicit` (an UnsupportedError otherwise), as over HTTP and gRPC.

    A change is made as a client's: in every worker of a server of several. One that a model
    asks for while it loads (from its initialize) says so (`while_loading`): it is made in this
    process alone, as each worker that loads that model asks for it there (a model that worker 0
    alone serves, such as a sequence model, makes it in worker 0 alone)."""

    async def load_model(self, name: str, parameters: dict[str, object], while_loading: bool = False) -> None:
        """Loads or reloads a model; `parameters` as a repository load request carries them
        (`config`: a JSON string, `file:<path>`: bytes). Raises a CoreserveError with the reason."""
        ...

    async def unload_model(self, name: str, dependents: bool = False, while_loading: bool = False) -> None:
        """Unloads a model and the ensembles that use it (`dependents`, Triton's
        `unload_dependents`, is accepted and changes nothing to that); `while_loading` as for
        `load_model`."""
        ...

    def model_ready(self, name: str, version: str = "") -> bool:
        """Whether the model (the version, if given) is ready to serve."""
        ...


class ServerActivity(Protocol):
    """How busy the server is; call its methods on the event loop."""

    def pending_requests(self) -> int:
        """Requests queued or executing in the whole server (Triton's pending request count
        leaves out those executing): 1 inside an execution means it is all the server has to do."""
        ...

    def frontend_reads(self) -> int:
        """A count that grows each time the HTTP or gRPC frontend reads bytes from a client: if
        it has not moved while an execution ran, no client sent anything meanwhile."""
        ...


@dataclass(frozen=True)
class ServerContext:
    """What a backend may ask of the server.

    `backend_config` holds the `--backend-config <backend>,<key>=<value>` settings given for
    this backend; `client` calls other models of this server (BLS, pipelines); `models` loads,
    unloads and checks models through the repository API; `metrics` adds custom metric
    families to the metrics endpoint (release them when the instance closes); `activity` says
    how busy the server is, for a backend that adapts to it; `copies` is how many copies of
    the model the server loads on this machine: one per worker process under
    `--http-thread-count` or `--grpc-infer-thread-count` (1 for a model worker 0 serves for
    all), so that a backend which
    sizes a thread pool by the machine's cores gives each copy its share.
    """

    backend_config: Mapping[str, str] = field(default_factory=dict)
    logger: logging.Logger = field(default_factory=lambda: logging.getLogger("coreserve.backend"))
    client: InferenceClient | None = None
    models: ModelControl | None = None
    metrics: CustomMetrics = field(default_factory=CustomMetrics)
    activity: ServerActivity | None = None
    copies: int = 1


@runtime_checkable
class ModelInstance(Protocol):
    """One loaded copy of a model that executes one batch at a time.

    Optional attributes, read with `getattr` (an instance may leave them out):

    - `concurrency: int`: an instance that may run several batches at once (it only waits
      on other models, as an ensemble does) says how many.
    - `pipeline_depth: int`: an instance that runs one batch at a time in a worker process
      of its own, but may be handed the next batches while it runs one (they wait there, in
      order), says how many it may hold. The scheduler hands them ahead only where batches
      need not form while the instance is busy (no dynamic or sequence batching, no rate
      limiter): the process then finds its next batch waiting instead of being woken for it.
    - `unstarted_requests: int`: such an instance says how many of the requests handed to it
      it has not begun: they still count as pending (`nv_inference_pending_request_count`, as
      on Triton, counts a request until an instance begins executing it). Read per scrape.
    - `failure: str | None`: an instance that can lose its ability to serve after it loaded
      (a worker process that died and cannot be restarted) sets it to the reason, and back
      to None once it can serve again. While an instance of a version has a failure, the
      version reports UNAVAILABLE with that reason (repository index, ready endpoints false,
      requests refused with UNAVAILABLE); it is READY again as soon as the failure clears.
      It is read on every request: a plain attribute, not a computation.
    - `serving: asyncio.Event`: an instance that restarts its worker process when it dies
      clears it for the restart and sets it again once the restart has ended (with `failure`
      set if it failed: `execute` then fails at once). While it is clear the scheduler gives
      the instance nothing: requests stay in the queue (their timeouts and cancellations
      apply) for another instance or for this one once it is back, and while no instance of
      a version is serving, its ready endpoints say not ready (requests are still queued).
      Requests that the dead process never started, the instance hands back with
      `Responder.requeue`.
    """

    async def execute(self, requests: Sequence[InferenceRequest], responder: Responder) -> None:
        """Executes requests the scheduler grouped, answering each through `responder`.

        Called on the event loop; run blocking framework calls on a thread of the
        instance's own (see `coreserve.backend.run_batched`). A request left unanswered
        when this returns fails with an internal error (unless the model is decoupled).
        """
        ...

    async def close(self) -> None:
        """Releases the instance; called once, after its last execute has finished. A reload
        that changes only `instance_group` closes the instances it retires while the
        version's others go on serving (and creates new ones beside them).

        On shutdown `--exit-timeout-secs` bounds the whole stop: a close still running when
        it runs out is cancelled. Release what must not outlive the server (kill and reap
        worker processes) in a `finally` block or on `asyncio.CancelledError`.
        """
        ...


@runtime_checkable
class Backend(Protocol):
    """A framework backend: knows a model format and creates instances of such models.

    Optional attributes, read with `getattr`:

    - `parallel_instance_loading: bool`, True where `create_instance` may run for several
      instances of a model version at once (Triton's backend attribute of that name); the
      server then creates them together, as Triton does. Otherwise it creates them one after
      another.
    - `default_cpu_instance_count: int`, the instances of a KIND_CPU group that sets no count
      (1 if left out). Triton has 2 for its ONNX Runtime and TensorFlow backends, 1 for others.
    """

    name: str
    platforms: tuple[str, ...]
    default_model_filename: str

    def auto_complete_config(
        self, model: ModelFiles, config: ModelConfig, server: ServerContext
    ) -> ModelConfig:
        """Fills what the configuration leaves out (inputs, outputs, max_batch_size) from the
        model file. Runs on a worker thread; returns the completed configuration."""
        ...

    async def create_instance(
        self, model: ModelFiles, config: ModelConfig, placement: InstancePlacement, server: ServerContext
    ) -> ModelInstance:
        """Loads one instance; raises a CoreserveError whose message says why it cannot."""
        ...


@runtime_checkable
class LoadStopper(Protocol):
    """A backend that runs something of its own for a load (an installer building a model's
    environment, say) which must not outlive the server: an optional part of the Backend
    protocol."""

    def stop_loads(self) -> None:
        """Called on the event loop as the server stops, before its models are unloaded: stop
        what still runs for loads under way (those loads then fail). Must not block."""
        ...
