"""A server without frontends, on an event loop thread of its own: the kit's one seam to the core.

The conformance suite drives models only through `InProcessServer`; it builds the core's
repository, loader and data plane itself. When the public in-process `coreserve.Server`
can register backends given in code, this module is the one to switch to it.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import threading
from collections.abc import Coroutine, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from coreserve.backend import Backend, BackendRegistry, hookimpl
from coreserve.backend.plugins.manager import Plugins
from coreserve.config import ModelConfig, config_to_dict
from coreserve.errors import CoreserveError
from coreserve.repository import ControlMode, ModelLoader, ModelRepository, source_for
from coreserve.server.changes import ModelsForBackends
from coreserve.server.dataplane import DataPlane, ServerFlags
from coreserve.types import InferenceRequest, InferenceResponse

T = TypeVar("T")
# A generous bound for one step (a load, a batch of requests) on a slow, shared machine.
STEP_TIMEOUT_S = 120.0


@dataclass
class Outcome:
    """What one request got: its responses with their final flags, or the error that ended it."""

    request: InferenceRequest
    responses: list[tuple[InferenceResponse | None, bool]] = field(default_factory=list)
    error: CoreserveError | None = None
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    # The ResponseSink protocol, so that the data plane delivers straight here.
    @property
    def done(self) -> bool:
        return self.ended.is_set()

    def send(self, response: InferenceResponse | None, final: bool) -> None:
        if not self.done:
            self.responses.append((response, final))
            if final:
                self.ended.set()

    def fail(self, error: CoreserveError) -> None:
        if not self.done:
            self.error = error
            self.ended.set()

    @property
    def final_sent(self) -> bool:
        return bool(self.responses) and self.responses[-1][1]

    @property
    def outputs(self) -> list[Mapping[str, Any]]:
        """The outputs of each response that carried some."""
        return [response.outputs for response, _ in self.responses if response is not None]


class _BackendsInCode:
    """A plugin that registers backend objects a test hands over (no entry point needed)."""

    def __init__(self, backends: Sequence[Backend]) -> None:
        self._backends = list(backends)

    @hookimpl
    def coreserve_register_backends(self, register: BackendRegistry) -> None:
        for backend in self._backends:
            register.add(backend)


class InProcessServer:
    """A model repository served in explicit control mode, with no HTTP, gRPC or metrics.

    Every method blocks until the loop thread has done the work (at most `STEP_TIMEOUT_S`).
    """

    def __init__(
        self,
        repository: Path,
        *,
        backends: Sequence[Backend] = (),
        backend_config: Mapping[str, Mapping[str, str]] | None = None,
        request_timeout: float = STEP_TIMEOUT_S,
    ) -> None:
        """`request_timeout`: how long `send` and `wait` wait for a request to end."""
        self.repository_path = repository
        self.request_timeout = request_timeout
        self._backends = backends
        self._backend_config = {name: dict(values) for name, values in (backend_config or {}).items()}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="coreserve-kit-loop", daemon=True)
        self._cache_dir = Path(tempfile.mkdtemp(prefix="coreserve-kit-"))
        self.dataplane: DataPlane | None = None

    def start(self) -> InProcessServer:
        self._thread.start()
        self.run(self._start())
        return self

    async def _start(self) -> None:
        plugins = Plugins()
        if self._backends:
            plugins.register(_BackendsInCode(self._backends), name="coreserve-testing-backends")
        loader = ModelLoader(plugins.backends(), backend_config=self._backend_config)
        repository = ModelRepository(
            [source_for(str(self.repository_path), self._cache_dir)],
            loader,
            mode=ControlMode.EXPLICIT,
            startup_models=(),
            cache_dir=self._cache_dir,
            drain_timeout=STEP_TIMEOUT_S,
        )
        self.dataplane = DataPlane(repository, ServerFlags(started=True))
        loader.client = self.dataplane
        loader.models = ModelsForBackends(
            self.dataplane.change, self.dataplane.apply_change, self.dataplane.model_ready
        )
        loader.activity = self.dataplane
        await repository.start()

    def stop(self) -> None:
        """Unloads every model, then ends the loop thread."""
        if self.dataplane is not None and self._thread.is_alive():
            self.run(self.dataplane.repository.unload_all(timeout=STEP_TIMEOUT_S))
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(STEP_TIMEOUT_S)
        self._loop.close()
        shutil.rmtree(self._cache_dir, ignore_errors=True)

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = STEP_TIMEOUT_S) -> T:
        """Runs a coroutine on the server's loop and returns its result."""
        future: Future[T] = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result(timeout)

    @property
    def _plane(self) -> DataPlane:
        assert self.dataplane is not None, "start() the server first"
        return self.dataplane

    # Models.

    def load(self, name: str, config: ModelConfig | None = None) -> None:
        """Loads (or reloads) a model, from its folder or with `config` in place of its own."""
        parameters: dict[str, object] = {}
        if config is not None:
            parameters["config"] = json.dumps(config_to_dict(config))
        self.run(self._plane.load_model(name, parameters))

    def unload(self, name: str) -> None:
        self.run(self._plane.unload_model(name))

    def state(self, name: str) -> tuple[str, str]:
        """The state of the model's latest version and the reason the index gives."""
        index = self.run(self._plane.repository_index())
        rows = [row for row in index if row.get("name") == name]
        if not rows:
            return "ABSENT", "not in the repository"
        row = max(rows, key=lambda row: int(row.get("version") or 0))
        return row.get("state", ""), row.get("reason", "")

    def config(self, name: str) -> ModelConfig:
        return self._plane.model_config(name)

    def metadata(self, name: str) -> dict[str, Any]:
        return self._plane.model_metadata(name)

    # Requests.

    def send(self, requests: Sequence[InferenceRequest]) -> list[Outcome]:
        """Submits the requests together and waits until each has ended (or `request_timeout` passed:
        one still open then is cancelled, as a client that gives up cancels it).

        A request refused before it was scheduled ends with its error, as any other.
        """
        return self.run(self._send(requests, self.request_timeout), self.request_timeout + 10)

    async def _send(self, requests: Sequence[InferenceRequest], timeout: float) -> list[Outcome]:
        outcomes = [Outcome(request) for request in requests]
        for outcome in outcomes:
            try:
                self._plane.submit(outcome.request, outcome)
            except CoreserveError as exc:
                outcome.fail(exc)
        waits = [asyncio.ensure_future(outcome.ended.wait()) for outcome in outcomes]
        _, pending = await asyncio.wait(waits, timeout=timeout)
        for wait in pending:
            wait.cancel()
        for outcome in outcomes:
            if not outcome.ended.is_set():  # (else its model, still answering it, could not unload)
                outcome.request.cancel()
        return outcomes

    def start_request(self, request: InferenceRequest) -> Outcome:
        """Submits one request and returns at once; `wait` for it later."""

        async def submit() -> Outcome:
            outcome = Outcome(request)
            try:
                self._plane.submit(request, outcome)
            except CoreserveError as exc:
                outcome.fail(exc)
            return outcome

        return self.run(submit())

    def wait(self, outcome: Outcome) -> bool:
        """Waits until the request has ended; False if it had not after `request_timeout` seconds
        (it is cancelled then, as a client that gives up cancels it)."""
        timeout = self.request_timeout

        async def ended() -> bool:
            try:
                await asyncio.wait_for(outcome.ended.wait(), timeout)
            except TimeoutError:
                outcome.request.cancel()
                return False
            return True

        return self.run(ended(), timeout + 10)

    def cancel(self, request: InferenceRequest) -> None:
        """Cancels a request, as a client that gives up does (on the loop thread)."""

        async def cancel() -> None:
            request.cancel()

        self.run(cancel())
