"""`CoreserveReplica`: one Ray Serve replica, an in-process coreserve.Server answering KServe v2."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from coreserve.inprocess import Server
from coreserve.ray._autoscaling import PENDING_REQUESTS

# Every answer names the replica that gave it: which one served is visible to clients and tests.
REPLICA_HEADER = "coreserve-replica"


class CoreserveReplica:
    """A Ray Serve deployment class: each replica serves the whole model repository itself.

    Requests reach it through Ray Serve's HTTP proxy with their KServe v2 paths, bodies and
    headers unchanged (JSON and the binary tensor extension), and are answered by the same
    routes and codecs as coreserve's own HTTP frontend, so `tritonclient.http` works against
    the proxy. Ray's health checks call `check_health`, which fails while a model is not
    ready; `record_autoscaling_stats` reports the pending-request count for
    `pending_requests_policy`.

    Parameters:
        model_repository: one location or several (folders every node can read, or `s3://…`).
        settings: `coreserve.Server` keyword arguments (`model_control_mode`, `load_models`,
            any `ServerOptions` field); network frontends stay closed.
    """

    def __init__(
        self, model_repository: str | Sequence[str], settings: Mapping[str, Any] | None = None
    ) -> None:
        self.identity = replica_identity()
        self._server = Server(model_repository, **dict(settings or {})).start()
        self._http = self._server.http_bridge()

    async def __call__(self, request: Request) -> Response:
        """Answers one KServe v2 request that the proxy routed here."""
        answer = await self._http.handle(
            request.method, request_path(request), request.headers, await request.body()
        )
        headers = {**answer.headers, REPLICA_HEADER: self.identity}
        if answer.chunks is not None:
            return StreamingResponse(answer.chunks, status_code=answer.status, headers=headers)
        return Response(answer.body, status_code=answer.status, headers=headers)

    def check_health(self) -> None:
        """Ray Serve's health check: raises (the replica is replaced) unless every model is ready."""
        if not self._server.ready():
            unready = [entry for entry in self._server.models() if entry.get("state") != "READY"]
            raise RuntimeError(f"coreserve replica {self.identity} is not ready: {unready}")

    def record_autoscaling_stats(self) -> dict[str, float]:
        """The custom autoscaling metric: requests queued or executing in this replica."""
        return {PENDING_REQUESTS: float(self._server.pending_requests())}

    def __del__(self) -> None:
        # Ray Serve calls it when it stops the replica: running requests finish, models unload.
        server = getattr(self, "_server", None)
        if server is not None:
            server.stop()


def replica_identity() -> str:
    """What the replica header says: host and process id."""
    return f"{socket.gethostname()}:{os.getpid()}"


def request_path(request: Request) -> str:
    """The path as the client sent it (percent-encoded, as coreserve's router expects), with its query."""
    raw_path = request.scope.get("raw_path")
    path = raw_path.decode("latin-1") if raw_path else request.url.path
    query = request.scope.get("query_string") or b""
    return f"{path}?{query.decode('latin-1')}" if query else path
