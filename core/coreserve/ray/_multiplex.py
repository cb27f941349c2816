"""Many-model repositories on Ray Serve: each replica holds at most N models, loaded on demand.

`CoreserveIngress` (one small deployment) reads the model name from a KServe v2 path and
asks Ray Serve's model multiplexing for a replica that holds that model; the replica loads
it into its in-process server (explicit control mode) if it does not, evicting its least
recently used model past `models_per_replica`. Clients are unchanged: the model name is
already in every v2 path.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import unquote

import orjson
from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.requests import Request
from starlette.responses import Response

from coreserve.errors import CoreserveError
from coreserve.inprocess import Server
from coreserve.ray._replica import REPLICA_HEADER, replica_identity, request_path
from coreserve.server.rest import HTTP_STATUS

_MODEL_PATH = re.compile(r"^/v2/models/([^/]+)(?:/|$)")
# An answer as it crosses from a replica to the ingress: status, headers, body.
Answer = tuple[int, dict[str, str], bytes]


class _LoadedModel:
    """A model a replica holds; Ray Serve's multiplexing drops it (least recently used first)."""

    def __init__(self, server: Server, name: str) -> None:
        self._server = server
        self.name = name
        self._unloaded = False

    def __del__(self) -> None:
        # Ray calls it on eviction, and Python may again when the object goes: unload once.
        if not self._unloaded:
            self._unloaded = True
            with contextlib.suppress(CoreserveError, RuntimeError):  # already gone, or the server stopped
                self._server.unload(self.name)


def multiplexed_replica_class(models_per_replica: int) -> type:
    """The replica class for a bound on models per replica (Ray's decorator takes it as a constant)."""

    class CoreserveMultiplexedReplica:
        """A replica whose in-process server loads the models its requests name, on demand."""

        def __init__(
            self, model_repository: str | Sequence[str], settings: Mapping[str, Any] | None = None
        ) -> None:
            self.identity = replica_identity()
            options = {**dict(settings or {}), "model_control_mode": "explicit", "load_models": []}
            self._server = Server(model_repository, **options).start()
            self._http = self._server.http_bridge()

        @serve.multiplexed(max_num_models_per_replica=models_per_replica)  # type: ignore[untyped-decorator]
        async def model(self, name: str) -> _LoadedModel:
            await asyncio.to_thread(self._server.load, name)  # loading must not hold up other models
            return _LoadedModel(self._server, name)

        async def answer(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Answer:
            """Answers one request forwarded by the ingress, loading its model first if needed."""
            name = serve.get_multiplexed_model_id()
            if name:
                try:
                    await self.model(name)
                except CoreserveError as exc:
                    return _error(exc, self.identity)
            answer = await self._http.handle(method, path, headers, body)
            content = answer.body
            if answer.chunks is not None:  # generate_stream: sent whole, after its last event
                content = b"".join([chunk async for chunk in answer.chunks])
            return answer.status, {**answer.headers, REPLICA_HEADER: self.identity}, content

        def check_health(self) -> None:
            if not self._server.live():
                raise RuntimeError(f"coreserve replica {self.identity} is not live")

        def __del__(self) -> None:
            server = getattr(self, "_server", None)
            if server is not None:
                server.stop()

    return CoreserveMultiplexedReplica


class CoreserveIngress:
    """Takes the proxy's KServe v2 requests and hands each to a replica that holds its model."""

    def __init__(self, replicas: DeploymentHandle[Any]) -> None:
        self._replicas = replicas

    async def __call__(self, request: Request) -> Response:
        path = request_path(request)
        match = _MODEL_PATH.match(path.partition("?")[0])
        name = unquote(match.group(1)) if match and match.group(1) != "stats" else ""
        handle = self._replicas.options(multiplexed_model_id=name) if name else self._replicas
        status, headers, body = await handle.answer.remote(
            request.method, path, dict(request.headers), await request.body()
        )
        return Response(body, status_code=status, headers=headers)


def _error(exc: CoreserveError, identity: str) -> Answer:
    headers = {"content-type": "application/json", REPLICA_HEADER: identity}
    return HTTP_STATUS[exc.code], headers, orjson.dumps({"error": exc.message})
