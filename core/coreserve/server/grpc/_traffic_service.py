"""coreserve.traffic.TrafficService: the traffic extension of the repository API over gRPC
(protos/traffic.proto), the same JSON documents and errors as its HTTP endpoints."""

from __future__ import annotations

from typing import Any

import orjson

from coreserve.errors import InvalidArgumentError
from coreserve.protos import traffic_pb2 as pb
from coreserve.protos import traffic_pb2_grpc as pb_grpc
from coreserve.server.dataplane import DataPlane
from coreserve.server.grpc._service import _unary
from coreserve.server.headers import ApiRestrictions

# The JSON a request carries is a policy or a plan: a few dozen values.
MAX_JSON_BYTES = 64 * 1024


def _document(text: str, what: str) -> object:
    if len(text) > MAX_JSON_BYTES:
        raise InvalidArgumentError(f"the {what} is {len(text)} bytes of JSON; at most {MAX_JSON_BYTES}")
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise InvalidArgumentError(f"malformed JSON in the {what}: {exc}") from None


class TrafficServicer(pb_grpc.TrafficServiceServicer):
    """Reads and sets models' traffic policies and runs their rollouts."""

    def __init__(self, dataplane: DataPlane, restrictions: ApiRestrictions | None = None) -> None:
        self._control = dataplane.traffic_control
        self._restrictions = restrictions or ApiRestrictions()

    @_unary("model-repository")
    async def ModelTraffic(self, request: pb.ModelTrafficRequest, context: Any) -> pb.ModelTrafficResponse:
        if request.policy_json:
            policy = await self._control.set_policy(
                request.model_name, _document(request.policy_json, "policy")
            )
        else:
            policy = await self._control.policy(request.model_name)
        return pb.ModelTrafficResponse(policy_json=orjson.dumps(policy).decode())

    @_unary("model-repository")
    async def ModelRollout(self, request: pb.ModelRolloutRequest, context: Any) -> pb.ModelRolloutResponse:
        plan = _document(request.plan_json, "rollout plan") if request.plan_json else None
        status = await self._control.rollout(request.model_name, request.action or "status", plan)
        return pb.ModelRolloutResponse(status_json=orjson.dumps(status).decode())
