"""The HTTP endpoints of the shared-memory extensions: region status, register, unregister.

    GET  /v2/systemsharedmemory[/region/{name}]/status
    POST /v2/systemsharedmemory/region/{name}/register     {"key": ..., "offset": ..., "byte_size": ...}
    POST /v2/systemsharedmemory[/region/{name}]/unregister

and the same paths under /v2/cudasharedmemory (register: {"raw_handle": {"b64": ...},
"device_id": ..., "byte_size": ...}), which answer that this server has no CUDA path where no
CUDA device is usable.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Awaitable, Callable
from typing import Any

from coreserve.errors import InvalidArgumentError, NotFoundError
from coreserve.server.changes import (
    Change,
    RegisterCudaRegion,
    RegisterSystemRegion,
    UnregisterCudaRegion,
    UnregisterSystemRegion,
)
from coreserve.server.httpd import HttpRequest, HttpResponse, Response
from coreserve.server.rest._json_bodies import json_answer, json_object
from coreserve.server.shared_memory import SystemSharedMemory, cuda_shared_memory_unavailable

Handler = Callable[[HttpRequest], Awaitable[Response]]
ReadBody = Callable[[HttpRequest], Awaitable[bytes | bytearray]]
MakeChange = Callable[[Change], Awaitable[None]]
CATEGORY = "shared-memory"  # the API restriction group, as Triton names it


def shared_memory_routes(
    regions: SystemSharedMemory, change: MakeChange, read_body: ReadBody
) -> list[tuple[str, str, str, Handler]]:
    """(category, method, path, handler) of every shared-memory endpoint; registrations go
    through `change` (`DataPlane.change`: every worker of a server of several)."""

    async def status(request: HttpRequest) -> HttpResponse:
        return json_answer(regions.status(request.match_info.get("name", "")))

    async def register(request: HttpRequest) -> HttpResponse:
        document = await _register_document(request, read_body, ("key", "byte_size"))
        name = request.match_info["name"]
        await change(
            RegisterSystemRegion(name, document["key"], document.get("offset", 0), document["byte_size"])
        )
        return HttpResponse(200)

    async def unregister(request: HttpRequest) -> HttpResponse:
        await change(UnregisterSystemRegion(request.match_info.get("name", "")))
        return HttpResponse(200)

    async def cuda_status(request: HttpRequest) -> HttpResponse:
        name = request.match_info.get("name", "")
        if regions.cuda is not None:
            return json_answer(regions.cuda.status(name))
        if name:  # no region can be registered, so none is found
            raise NotFoundError(f"Unable to find cuda shared memory region: '{name}'")
        return json_answer([])

    async def cuda_register(request: HttpRequest) -> HttpResponse:
        name = request.match_info["name"]
        if regions.cuda is None:
            raise cuda_shared_memory_unavailable(name)
        document = await _register_document(request, read_body, ("raw_handle", "device_id", "byte_size"))
        handle = document["raw_handle"]
        if not isinstance(handle, dict) or not isinstance(handle.get("b64"), str):
            raise InvalidArgumentError(
                f"CUDA shared memory region '{name}': 'raw_handle' must be {{\"b64\": ...}}"
            )
        try:
            raw = base64.b64decode(handle["b64"], validate=True)
        except binascii.Error:
            raise InvalidArgumentError(
                f"CUDA shared memory region '{name}': 'raw_handle' is not base64"
            ) from None
        await change(RegisterCudaRegion(name, raw, document["device_id"], document["byte_size"]))
        return HttpResponse(200)

    async def cuda_unregister(request: HttpRequest) -> HttpResponse:
        await change(UnregisterCudaRegion(request.match_info.get("name", "")))
        return HttpResponse(200)

    routes: list[tuple[str, str, str, Handler]] = []
    for base, on_status, on_register, on_unregister in (
        ("/v2/systemsharedmemory", status, register, unregister),
        ("/v2/cudasharedmemory", cuda_status, cuda_register, cuda_unregister),
    ):
        region = f"{base}/region/{{name}}"
        routes += [
            (CATEGORY, "GET", f"{base}/status", on_status),
            (CATEGORY, "GET", f"{region}/status", on_status),
            (CATEGORY, "POST", f"{region}/register", on_register),
            (CATEGORY, "POST", f"{base}/unregister", on_unregister),
            (CATEGORY, "POST", f"{region}/unregister", on_unregister),
        ]
    return routes


async def _register_document(
    request: HttpRequest, read_body: ReadBody, fields: tuple[str, ...]
) -> dict[str, Any]:
    """The JSON object of a register request, with each of `fields` present."""
    document = json_object(await read_body(request), "shared memory register request")
    for field in fields:
        if field not in document:
            raise InvalidArgumentError(f"Shared memory register request has no '{field}' field")
    return document
