"""Puts the gRPC services on a server: grpc.aio's (`_grpcio`) or the native one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from coreserve.protocol.grpc_received import parse_model_infer_request
from coreserve.protocol.grpc_response import SerializedPieces
from coreserve.protos import grpc_service_pb2 as pb
from coreserve.protos import grpc_service_pb2_grpc as pb_grpc
from coreserve.protos import health_pb2, health_pb2_grpc, traffic_pb2_grpc
from coreserve.server.dataplane import DataPlane
from coreserve.server.grpc._decoding import DecodingRegistrar
from coreserve.server.grpc._service import DEFAULT_MAX_STREAM_INFLIGHT, InferenceServicer
from coreserve.server.grpc._traffic_service import TrafficServicer
from coreserve.server.headers import ApiRestrictions, HeaderForwarding


class HealthServicer(health_pb2_grpc.HealthServicer):
    """grpc.health.v1: SERVING while the server is ready (what its readiness endpoint says), for
    any service name, as Triton answers (a probe configured with a service name passes there)."""

    def __init__(self, dataplane: DataPlane, watch_interval: float = 1.0) -> None:
        self._dataplane = dataplane
        self._watch_interval = watch_interval

    def _status(self) -> health_pb2.HealthCheckResponse.ServingStatus:
        Status = health_pb2.HealthCheckResponse
        return Status.SERVING if self._dataplane.ready() else Status.NOT_SERVING

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: Any
    ) -> health_pb2.HealthCheckResponse:
        return health_pb2.HealthCheckResponse(status=self._status())

    async def Watch(
        self, request: health_pb2.HealthCheckRequest, context: Any
    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        last = None
        while True:
            status = self._status()
            if status != last:
                yield health_pb2.HealthCheckResponse(status=status)
                last = status
            await asyncio.sleep(self._watch_interval)


def add_services(
    server: Any,
    dataplane: DataPlane,
    restrictions: ApiRestrictions | None,
    max_stream_inflight: int = DEFAULT_MAX_STREAM_INFLIGHT,
    *,
    takes_pieces: bool = False,
    header_forwarding: HeaderForwarding | None = None,
) -> None:
    """Registers GRPCInferenceService, grpc.health.v1 and coreserve.traffic on `server`:
    grpc.aio's or the native one.

    `server` takes `add_registered_method_handlers(service, handlers)` as grpc.aio's does.
    `takes_pieces`: the server sends a large response as its SerializedPieces (the native one).
    """
    serialized = _serialized_or_pieces if takes_pieces else _serialized
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(  # type: ignore[no-untyped-call]
        InferenceServicer(dataplane, restrictions, max_stream_inflight, header_forwarding),
        DecodingRegistrar(
            server,
            # Large raw contents are kept as views of the received bytes (no copy).
            {"ModelInfer": parse_model_infer_request, "ModelStreamInfer": parse_model_infer_request},
            {"ModelInfer": serialized, "ModelStreamInfer": serialized},
        ),
    )
    health_pb2_grpc.add_HealthServicer_to_server(  # type: ignore[no-untyped-call]
        HealthServicer(dataplane), DecodingRegistrar(server)
    )
    traffic_pb2_grpc.add_TrafficServiceServicer_to_server(  # type: ignore[no-untyped-call]
        TrafficServicer(dataplane, restrictions), DecodingRegistrar(server)
    )


InferReply = bytes | SerializedPieces | pb.ModelInferResponse | pb.ModelStreamInferResponse


def _serialized(response: InferReply) -> bytes:
    """An inference response on the wire: most come serialized already (no message copies)."""
    if isinstance(response, bytes):
        return response
    return response.joined() if isinstance(response, SerializedPieces) else response.SerializeToString()


def _serialized_or_pieces(response: InferReply) -> bytes | SerializedPieces:
    """The same for a server that takes a large response in pieces."""
    return response if isinstance(response, SerializedPieces) else _serialized(response)
