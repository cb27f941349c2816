"""The gRPC frontend on grpc.aio (`--grpc-server grpcio`, and TLS)."""

from __future__ import annotations

import logging

import grpc

from coreserve.server.dataplane import DataPlane
from coreserve.server.grpc._server import add_services
from coreserve.server.grpc._service import DEFAULT_MAX_STREAM_INFLIGHT
from coreserve.server.grpc._transport import GrpcTransport
from coreserve.server.headers import ApiRestrictions, HeaderForwarding

logger = logging.getLogger("coreserve.server.grpc")  # the name both gRPC servers log under


class GrpcFrontend:
    """Serves the gRPC services for one data plane on one address and port."""

    def __init__(
        self,
        dataplane: DataPlane,
        *,
        address: str,
        port: int,
        max_message_size: int,
        restrictions: ApiRestrictions | None = None,
        max_stream_inflight: int = DEFAULT_MAX_STREAM_INFLIGHT,
        transport: GrpcTransport | None = None,
        header_forwarding: HeaderForwarding | None = None,
    ) -> None:
        self._dataplane = dataplane
        self._address = address
        self.port = port
        self._transport = transport or GrpcTransport()
        self._server = grpc.aio.server(
            options=[
                ("grpc.max_send_message_length", max_message_size),
                ("grpc.max_receive_message_length", max_message_size),
                *self._transport.server_options(),
            ],
        )
        add_services(
            self._server, dataplane, restrictions, max_stream_inflight, header_forwarding=header_forwarding
        )

    async def start(self) -> None:
        host = f"[{self._address}]" if ":" in self._address else self._address
        tls = self._transport.tls
        if tls is None:
            self.port = self._server.add_insecure_port(f"{host}:{self.port}")
        else:  # credentials() raises TlsFileError, a start-up error, for a file it cannot use
            self.port = self._server.add_secure_port(f"{host}:{self.port}", tls.credentials())
        await self._server.start()
        logger.info("Started GRPCInferenceService at %s:%d", self._address, self.port)

    async def stop(self, grace: float | None = None) -> None:
        await self._server.stop(grace)
