"""How the gRPC server talks on the wire: TLS, keepalive, connection age, response compression.

Each setting is one of tritonserver's `--grpc-*` flags and becomes the gRPC core channel
argument Triton sets for it. Settings left at None are not passed, so gRPC's own defaults
apply (they are Triton's defaults too).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc

from coreserve.server.tls_files import TlsFileError, read_pem, server_context

# --grpc-infer-response-compression-level: gRPC core's compression levels.
COMPRESSION_LEVELS = {"none": 0, "low": 1, "medium": 2, "high": 3}
# --grpc-handshake-timeout-secs (coreserve's own; gRPC core's default is 120 s).
DEFAULT_HANDSHAKE_TIMEOUT_S = 20.0
# Streams one connection may have open at once on grpc.aio (gRPC core sets no limit, nor does
# Triton). It bounds a rapid-reset flood (CVE-2023-44487): gRPC core counts the streams a client
# has reset but that the server has not yet released against it and refuses the streams past it
# (REFUSED_STREAM), so one connection queues at most this many calls ahead of other clients' calls
# of the same method. Without it such calls pile up until gRPC core's guard on calls waiting for
# the application (grpc.server.max_pending_requests, 1,000 to 3,000) cancels new calls of that
# method at random, other clients' included. 100 is nghttpx's default (Go's server takes 250).
DEFAULT_MAX_CONCURRENT_STREAMS = 100


@dataclass(frozen=True)
class GrpcTls:
    """--grpc-use-ssl and its files; `mutual`: clients must show a certificate the root signed."""

    server_cert: Path
    server_key: Path
    root_cert: Path | None = None
    mutual: bool = False

    def credentials(self) -> grpc.ServerCredentials:
        """The server's credentials; raises TlsFileError naming the file that cannot be read."""
        key = read_pem(self.server_key, "--grpc-server-key")
        cert = read_pem(self.server_cert, "--grpc-server-cert")
        root = read_pem(self.root_cert, "--grpc-root-cert") if self.root_cert is not None else None
        if self.mutual and root is None:
            raise TlsFileError("--grpc-use-ssl-mutual needs --grpc-root-cert to check client certificates")
        return grpc.ssl_server_credentials(
            [(key, cert)], root_certificates=root, require_client_auth=self.mutual
        )

    def context(self) -> ssl.SSLContext:
        """The same for the native server: a TLS context offering HTTP/2 ("h2") through ALPN."""
        cert, key, root = self.server_cert, self.server_key, self.root_cert
        return server_context(cert, key, root, mutual=self.mutual, flags="--grpc", alpn="h2")


@dataclass(frozen=True)
class GrpcTransport:
    """The --grpc-* transport settings of tritonserver (times in milliseconds, as its flags)."""

    tls: GrpcTls | None = None
    compression_level: str = "none"
    reuse_port: bool = False
    keepalive_time_ms: int | None = None
    keepalive_timeout_ms: int | None = None
    keepalive_permit_without_calls: bool | None = None
    http2_max_pings_without_data: int | None = None
    http2_min_recv_ping_interval_without_data_ms: int | None = None
    http2_max_ping_strikes: int | None = None
    max_connection_age_ms: int | None = None
    max_connection_age_grace_ms: int | None = None
    # A new connection's TLS handshake, then its HTTP/2 connection preface, must each arrive
    # within this; a client that stays silent is dropped (gRPC core: its server handshake timeout).
    handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S
    max_concurrent_streams: int = DEFAULT_MAX_CONCURRENT_STREAMS  # grpc.aio only (see above)

    def server_options(self) -> list[tuple[str, int]]:
        """gRPC core channel arguments for these settings."""
        options = [
            ("grpc.so_reuseport", int(self.reuse_port)),
            ("grpc.default_compression_level", COMPRESSION_LEVELS[self.compression_level]),
            ("grpc.server_handshake_timeout_ms", round(self.handshake_timeout_s * 1000)),
            ("grpc.max_concurrent_streams", self.max_concurrent_streams),
        ]
        optional = {
            "grpc.keepalive_time_ms": self.keepalive_time_ms,
            "grpc.keepalive_timeout_ms": self.keepalive_timeout_ms,
            "grpc.keepalive_permit_without_calls": self.keepalive_permit_without_calls,
            "grpc.http2.max_pings_without_data": self.http2_max_pings_without_data,
            "grpc.http2.min_ping_interval_without_data_ms": self.http2_min_recv_ping_interval_without_data_ms,
            "grpc.http2.max_ping_strikes": self.http2_max_ping_strikes,
            "grpc.max_connection_age_ms": self.max_connection_age_ms,
            "grpc.max_connection_age_grace_ms": self.max_connection_age_grace_ms,
        }
        options += [(name, int(value)) for name, value in optional.items() if value is not None]
        return options
