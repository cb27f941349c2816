"""The gRPC frontend on the native HTTP/2 server (`--grpc-server native`).

Serves the same servicers as the grpc.aio frontend, registered by the same function, so both
share one data path; only the transport differs. With --grpc-use-ssl the listening socket
wraps each connection in TLS (ALPN "h2") before the HTTP/2 parser sees a byte.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

import grpc

from coreserve.server.dataplane import DataPlane
from coreserve.server.grpc._server import add_services
from coreserve.server.grpc._service import DEFAULT_MAX_STREAM_INFLIGHT
from coreserve.server.grpc._transport import GrpcTransport
from coreserve.server.grpc.native._connection import Http2Connection
from coreserve.server.headers import ApiRestrictions, HeaderForwarding

logger = logging.getLogger("coreserve.server.grpc")


class NativeGrpcFrontend:
    """Serves the gRPC services for one data plane on one address and port, over our HTTP/2."""

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
        self._transport = transport or GrpcTransport()
        self._address = address
        self.port = port
        self._max_message_size = max_message_size
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}
        self._connections: set[Http2Connection] = set()
        self._server: asyncio.Server | None = None
        add_services(
            self,
            dataplane,
            restrictions,
            max_stream_inflight,
            takes_pieces=True,
            header_forwarding=header_forwarding,
        )

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        """Ignored: the same handlers come through add_registered_method_handlers."""

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        for name, handler in handlers.items():
            self._handlers[f"/{service}/{name}"] = handler

    def _connection(self) -> Http2Connection:
        # Known once made: under TLS, asyncio makes the protocol before the handshake, and one
        # whose handshake fails is never made (nor lost), and would stay here for good.
        return Http2Connection(
            self._handlers,
            self._max_message_size,
            self._transport,
            self._connections.discard,
            on_open=self._connections.add,
        )

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        tls = self._transport.tls
        try:
            self._server = await loop.create_server(
                self._connection,
                host=self._address,
                port=self.port,
                reuse_port=self._transport.reuse_port or None,
                backlog=1024,
                ssl=tls.context() if tls is not None else None,
                ssl_handshake_timeout=self._transport.handshake_timeout_s if tls is not None else None,
            )
        except OSError as exc:  # grpcio's words, which the start-up error repeats
            raise OSError(f"Failed to bind to address {self._address}:{self.port}: {exc.strerror}") from None
        for sock in self._server.sockets:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.port = self._server.sockets[0].getsockname()[1]
        over = " over TLS" if tls is not None else ""
        logger.info("Started GRPCInferenceService at %s:%d (native HTTP/2%s)", self._address, self.port, over)

    async def stop(self, grace: float | None = None) -> None:
        if self._server is None:
            return
        self._server.close()
        await asyncio.gather(*(connection.shut_down(grace) for connection in list(self._connections)))
        await self._server.wait_closed()
