"""`Server`: a coreserve server inside a Python program, with no sockets unless asked for."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

from coreserve.backend.plugins.manager import Plugins
from coreserve.errors import InvalidArgumentError
from coreserve.inprocess._http import HttpBridge
from coreserve.inprocess._loop import LoopThread
from coreserve.inprocess._model import Model
from coreserve.repository import ControlMode
from coreserve.server import ServerOptions, ServerRuntime
from coreserve.server.rest import HttpFrontend

T = TypeVar("T")
FRONTENDS = ("grpc", "http", "metrics")
_OPTION_NAMES = frozenset(field.name for field in dataclasses.fields(ServerOptions))


class Server:
    """A coreserve server in this process: models, inference and control as Python calls.

    Example::

        with coreserve.Server("models") as server:
            result = server.model("simple").infer({"INPUT0": a, "INPUT1": b})
            print(result.outputs["OUTPUT0"])

    The server runs on an event loop thread of its own: every method may be called from any
    other thread, and the blocking ones from inside a running event loop too (they then block
    that loop; async callers use `Model.async_infer` and `Model.async_stream`). Errors are
    `coreserve.CoreserveError` subclasses, as a client would see them over the wire.

    Parameters:
        model_repository: one repository location or several (folders, or `s3://…` and other
            fsspec URLs), as `coreserve --model-repository` takes them.
        model_control_mode: "none" (the default: load everything, fixed), "explicit" (load and
            unload by call; only `load_models` at start) or "poll".
        load_models: the models to load at start in explicit mode (`--load-model`).
        frontends: which network frontends to open as well: any of "http", "grpc", "metrics"
            (none by default). Their addresses and ports are options (`http_port=0` picks a
            free port; `server.ports` says which).
        options: a whole `ServerOptions` to start from; the arguments above override it.
        plugins: plugin objects or modules to register beside the installed ones (each with a
            `coreserve_register_backends` hook implementation): backends given in code.
        settings: any other `ServerOptions` field by name (`exit_timeout_secs=5`,
            `strict_readiness=False`, `backend_config={...}` …).
    """

    def __init__(
        self,
        model_repository: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] = (),
        *,
        model_control_mode: str | ControlMode | None = None,
        load_models: Iterable[str] = (),
        frontends: Iterable[str] = (),
        options: ServerOptions | None = None,
        plugins: Iterable[object] = (),
        **settings: Any,
    ) -> None:
        self.options = _options(
            model_repository, model_control_mode, load_models, frontends, options, settings
        )
        self._plugins = list(plugins)
        self._loop: LoopThread | None = None
        self._http: HttpFrontend | None = None  # the routes http_bridge() answers with
        self._runtime: ServerRuntime | None = None
        self._stopped = False

    # Life cycle.

    def start(self) -> Server:
        """Loads the models (and opens the frontends asked for); returns the server itself.

        :raises coreserve.StartupError: a repository cannot be read, or a model failed to load
            while `exit_on_error` is true (the default), or a frontend's port cannot be bound.
        """
        if self._stopped:
            raise RuntimeError("a stopped coreserve.Server cannot start again; make a new one")
        if self._runtime is not None:
            return self
        loop = LoopThread(name="coreserve-server")
        try:
            runtime = loop.run(_construct(self.options, self._plugins))
            self._loop, self._runtime = loop, runtime
            loop.run(_start(runtime))
        except BaseException:
            if self._runtime is None:
                loop.stop()
            else:
                self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stops serving: lets running requests finish (up to `exit_timeout_secs`), unloads every
        model, closes the frontends, and ends the loop thread. Calling it again does nothing."""
        if self._stopped:
            return
        self._stopped = True
        if self._loop is None:
            return
        try:
            if self._http is not None:
                self._loop.run(self._http.stop())
            if self._runtime is not None:
                self._loop.run(self._runtime.stop())
        finally:
            self._loop.stop()

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    # Health and models.

    def live(self) -> bool:
        """True while the server runs (started, not stopping)."""
        return self._runtime is not None and not self._stopped and self._runtime.dataplane.live()

    def ready(self) -> bool:
        """True when started and every model is ready (only started, with strict_readiness=False)."""
        if self._runtime is None or self._stopped:
            return False
        return bool(self._run(_call(self._runtime.dataplane.ready)))

    def models(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Every model of the repositories: `name`, `version`, `state` and, when not ready, `reason`."""
        return self._run(self._started().dataplane.repository_index(ready_only))

    def model(self, name: str, version: int | str = "") -> Model:
        """A handle on a model (the latest ready version unless `version` names one)."""
        runtime = self._started()
        assert self._loop is not None
        return Model(runtime.dataplane, self._loop, name, version)

    def load(
        self,
        name: str,
        *,
        config: Mapping[str, Any] | str | None = None,
        files: Mapping[str, bytes] | None = None,
    ) -> None:
        """Loads or reloads a model (explicit mode), as Triton's repository load request does.

        :param config: a configuration to use instead of the repository's (JSON text or a dict
            in Triton's JSON form).
        :param files: model files to use instead of the repository's, path in the model folder
            (`"1/model.onnx"`) -> contents; needs `config`.
        """
        parameters: dict[str, object] = {}
        if config is not None:
            parameters["config"] = config if isinstance(config, str) else json.dumps(config)
        for path, contents in (files or {}).items():
            parameters[f"file:{path}"] = contents
        self._run(self._started().dataplane.load_model(name, parameters))

    def unload(self, name: str, *, dependents: bool = False) -> None:
        """Unloads a model (explicit mode); `dependents` unloads the models it uses too (ensembles)."""
        self._run(self._started().dataplane.unload_model(name, dependents))

    # Observability.

    def metrics(self) -> str:
        """The metrics a scrape of `/metrics` gives, in Prometheus text format ("" with metrics off)."""
        report = self._started().metrics_report
        return "" if report is None else self._run(report.render_on_loop())

    def metadata(self) -> dict[str, Any]:
        """Server name, version and extensions: the v2 protocol's server metadata."""
        return self._started().dataplane.server_metadata()

    def pending_requests(self) -> int:
        """Requests queued or executing in every model: what an autoscaler watches (the
        metric `nv_inference_pending_request_count` counts those queued, as Triton's does)."""
        return int(self._run(_call(self._started().dataplane.pending_requests)))

    def http_bridge(self) -> HttpBridge:
        """The v2 REST API of this server as a call, for an HTTP server that is not coreserve's.

        Ray Serve's deployment (`coreserve.ray`) answers its proxy's requests with it: the same
        routes, codecs, limits and error texts as the `http` frontend, without its socket.
        """
        runtime = self._started()
        assert self._loop is not None
        if self._http is None:
            self._http = self._run(_call(runtime.http_frontend))
        return HttpBridge(self._http, self._loop)

    @property
    def ports(self) -> dict[str, int]:
        """The ports the open frontends listen on, by frontend ("http", "grpc", "metrics")."""
        runtime = self._started()
        frontends = {"http": runtime.http, "grpc": runtime.grpc, "metrics": runtime.metrics}
        return {name: frontend.port for name, frontend in frontends.items() if frontend is not None}

    # Helpers.

    def _started(self) -> ServerRuntime:
        if self._stopped:
            raise RuntimeError("this coreserve.Server is stopped")
        if self._runtime is None:
            raise RuntimeError("this coreserve.Server is not started: call start() or use it in a with block")
        return self._runtime

    def _run(self, work: Coroutine[Any, Any, T]) -> T:
        assert self._loop is not None
        return self._loop.run(work)


async def _construct(options: ServerOptions, extra_plugins: list[object]) -> ServerRuntime:
    """The runtime, made on the loop it will run on (what it creates binds to that loop)."""
    plugins = Plugins()
    for plugin in extra_plugins:
        plugins.register(plugin)
    return ServerRuntime(options, plugins=plugins)


async def _start(runtime: ServerRuntime) -> None:
    await runtime.start()


async def _call(function: Any) -> Any:
    return function()


def _options(
    model_repository: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    model_control_mode: str | ControlMode | None,
    load_models: Iterable[str],
    frontends: Iterable[str],
    base: ServerOptions | None,
    settings: Mapping[str, Any],
) -> ServerOptions:
    """The ServerOptions the constructor's arguments describe; refuses unknown names and values."""
    unknown = sorted(set(settings) - _OPTION_NAMES)
    if unknown:
        raise InvalidArgumentError(f"unknown coreserve.Server setting(s) {unknown}; see ServerOptions")
    opened = set(frontends)
    if opened - set(FRONTENDS):
        raise InvalidArgumentError(
            f"unknown frontend(s) {sorted(opened - set(FRONTENDS))}; known: {FRONTENDS}"
        )
    options = base if base is not None else ServerOptions(model_repositories=[])
    try:
        mode = ControlMode(model_control_mode or options.model_control_mode)
    except ValueError:
        raise InvalidArgumentError(
            f"model_control_mode must be one of {[m.value for m in ControlMode]}, not {model_control_mode!r}"
        ) from None
    locations = (
        [model_repository] if isinstance(model_repository, (str, os.PathLike)) else list(model_repository)
    )
    changes: dict[str, Any] = dict(settings)
    if locations:
        changes["model_repositories"] = [os.fspath(location) for location in locations]
    changes.update(
        model_control_mode=mode,
        load_models=list(load_models) or options.load_models,
        allow_http="http" in opened,
        allow_grpc="grpc" in opened,
        open_metrics_port="metrics" in opened,
    )
    if "metrics" in opened:
        changes["allow_metrics"] = True
    options = dataclasses.replace(options, **changes)
    if not options.model_repositories:
        raise InvalidArgumentError("coreserve.Server needs at least one model repository")
    return options
