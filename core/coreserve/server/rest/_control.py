"""The REST endpoints that control the server rather than infer: the model repository (index,
load, unload), the log settings and the trace settings.

    POST /v2/repository/index                     {"ready": bool}
    POST /v2/repository/models/{model}/load       {"parameters": {"config": ..., "file:...": base64}}
    POST /v2/repository/models/{model}/unload     {"parameters": {"unload_dependents": bool}}
    POST /v2/repository/{repository}/...          (a repository named: 501, as Triton)
    GET|POST /v2/logging
    GET|POST /v2/trace/setting, /v2/models/{model}/trace/setting
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Awaitable, Callable
from typing import Any

from coreserve.errors import InvalidArgumentError
from coreserve.server.changes import repository_named
from coreserve.server.dataplane import DataPlane
from coreserve.server.httpd import HttpRequest, HttpResponse, Response
from coreserve.server.rest._json_bodies import json_answer, json_object

Handler = Callable[[HttpRequest], Awaitable[Response]]
ReadBody = Callable[[HttpRequest], Awaitable[bytes | bytearray]]


def control_routes(dataplane: DataPlane, read_body: ReadBody) -> list[tuple[str, str, str, Handler]]:
    """(category, method, path, handler) of every control endpoint; the category is the API
    restriction group, as Triton names it."""

    async def repository_index(request: HttpRequest) -> HttpResponse:
        body = await read_body(request)
        options = json_object(body, "repository index request") if body.strip() else {}
        ready = options.get("ready", False)
        if not isinstance(ready, bool):
            raise InvalidArgumentError("'ready' of a repository index request must be true or false")
        return json_answer(await dataplane.repository_index(ready_only=ready))

    async def control_parameters(request: HttpRequest) -> dict[str, Any]:
        body = await read_body(request)
        options = json_object(body, "repository request") if body.strip() else {}
        parameters = options.get("parameters", {})
        if not isinstance(parameters, dict):
            raise InvalidArgumentError("'parameters' of a repository request must be a JSON object")
        return parameters

    async def load_model(request: HttpRequest) -> HttpResponse:
        parameters = await control_parameters(request)
        decoded: dict[str, object] = {}
        for key, value in parameters.items():
            if key.startswith("file:"):  # file contents travel base64-encoded over HTTP
                if not isinstance(value, str):
                    raise InvalidArgumentError(f"load parameter '{key}' must be a base64 string")
                try:
                    decoded[key] = base64.b64decode(value, validate=True)
                except binascii.Error:
                    raise InvalidArgumentError(f"load parameter '{key}' is not valid base64") from None
            else:
                decoded[key] = value
        await dataplane.load_model(request.match_info["model"], decoded)
        return HttpResponse(200)

    async def unload_model(request: HttpRequest) -> HttpResponse:
        parameters = await control_parameters(request)
        dependents = parameters.get("unload_dependents", False)
        if not isinstance(dependents, bool):
            raise InvalidArgumentError("unload parameter 'unload_dependents' must be true or false")
        await dataplane.unload_model(request.match_info["model"], dependents)
        return HttpResponse(200)

    async def named_repository(request: HttpRequest) -> HttpResponse:
        raise repository_named()

    async def log_settings(request: HttpRequest) -> HttpResponse:
        return json_answer(dataplane.log_settings().as_dict())

    async def update_log_settings(request: HttpRequest) -> HttpResponse:
        changes = json_object(await read_body(request), "log settings")
        return json_answer((await dataplane.update_log_settings(changes)).as_dict())

    async def trace_setting(request: HttpRequest) -> HttpResponse:
        return json_answer(dataplane.trace_setting(request.match_info.get("model", "")))

    async def update_trace_setting(request: HttpRequest) -> HttpResponse:
        changes = json_object(await read_body(request), "trace settings")
        model = request.match_info.get("model", "")
        return json_answer(await dataplane.update_trace_setting(changes, model))

    model = "/v2/models/{model}"
    return [
        ("model-repository", "POST", "/v2/repository/index", repository_index),
        ("model-repository", "POST", "/v2/repository/models/{model}/load", load_model),
        ("model-repository", "POST", "/v2/repository/models/{model}/unload", unload_model),
        ("model-repository", "POST", "/v2/repository/{repository}/index", named_repository),
        ("model-repository", "POST", "/v2/repository/{repository}/models/{model}/load", named_repository),
        ("model-repository", "POST", "/v2/repository/{repository}/models/{model}/unload", named_repository),
        ("logging", "GET", "/v2/logging", log_settings),
        ("logging", "POST", "/v2/logging", update_log_settings),
        ("trace", "GET", "/v2/trace/setting", trace_setting),
        ("trace", "POST", "/v2/trace/setting", update_trace_setting),
        ("trace", "GET", f"{model}/trace/setting", trace_setting),
        ("trace", "POST", f"{model}/trace/setting", update_trace_setting),
    ]
