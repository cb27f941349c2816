"""The gRPC frontend: KServe v2's `GRPCInferenceService` and grpc.health.v1 over the data plane.

The servicers (`_service`, `_server`) are written once and served by either transport: grpc.aio
(`_grpcio`, `--grpc-server grpcio` and TLS) or coreserve's own HTTP/2 server (`native/`).
`_decoding` turns undecodable messages into INVALID_ARGUMENT; `_transport` holds the wire
settings both share. May import the server's runtime modules (data plane, restrictions), the
protocol codecs and the generated protos; never the other frontends.
"""

from __future__ import annotations

from coreserve.server.grpc._grpcio import GrpcFrontend
from coreserve.server.grpc._transport import DEFAULT_HANDSHAKE_TIMEOUT_S, GrpcTls, GrpcTransport

__all__ = ["DEFAULT_HANDSHAKE_TIMEOUT_S", "GrpcFrontend", "GrpcTls", "GrpcTransport"]
