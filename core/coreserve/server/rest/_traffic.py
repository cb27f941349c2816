"""The REST endpoints of coreserve's traffic extension of the repository API (Triton has none):

    GET|POST /v2/repository/models/{model}/traffic    {"weights": {"1": 90, "2": 10}, "shadow": ...}
    GET|POST /v2/repository/models/{model}/rollout    (POST: a plan, to start a rollout)
    POST     /v2/repository/models/{model}/rollout/promote, .../rollout/abort

Each answers the model's policy or rollout as JSON (see `coreserve.server.traffic`).
"""

from __future__ import annotations

from coreserve.server.dataplane import DataPlane
from coreserve.server.httpd import HttpRequest, HttpResponse
from coreserve.server.rest._control import Handler, ReadBody
from coreserve.server.rest._json_bodies import json_answer, json_object


def traffic_routes(dataplane: DataPlane, read_body: ReadBody) -> list[tuple[str, str, str, Handler]]:
    """(category, method, path, handler) of the traffic endpoints, in the repository's category."""
    control = dataplane.traffic_control

    async def policy(request: HttpRequest) -> HttpResponse:
        return json_answer(await control.policy(request.match_info["model"]))

    async def set_policy(request: HttpRequest) -> HttpResponse:
        document = json_object(await read_body(request), "traffic policy")
        return json_answer(await control.set_policy(request.match_info["model"], document))

    async def rollout_status(request: HttpRequest) -> HttpResponse:
        return json_answer(await control.rollout(request.match_info["model"], "status"))

    async def start_rollout(request: HttpRequest) -> HttpResponse:
        plan = json_object(await read_body(request), "rollout plan")
        return json_answer(await control.rollout(request.match_info["model"], "start", plan))

    async def rollout_action(request: HttpRequest) -> HttpResponse:
        info = request.match_info
        body = await read_body(request)
        plan = json_object(body, "rollout plan") if body.strip() else None  # .../rollout/start
        return json_answer(await control.rollout(info["model"], info["action"], plan))

    base = "/v2/repository/models/{model}"
    return [
        ("model-repository", "GET", f"{base}/traffic", policy),
        ("model-repository", "POST", f"{base}/traffic", set_policy),
        ("model-repository", "GET", f"{base}/rollout", rollout_status),
        ("model-repository", "POST", f"{base}/rollout", start_rollout),
        ("model-repository", "POST", f"{base}/rollout/{{action}}", rollout_action),
    ]
