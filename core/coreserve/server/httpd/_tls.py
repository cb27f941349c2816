"""HTTP over TLS: --http-use-ssl, --http-use-ssl-mutual and their certificate files.

Triton's HTTP server has no TLS (it is left to a proxy in front); these flags mirror its
`--grpc-use-ssl*` ones, so one set of certificates serves both doors. The listening socket
wraps each connection in TLS before the HTTP parser sees a byte: a client that speaks plain
HTTP, or shows no certificate (or a stranger's) under mutual TLS, fails its handshake and is
dropped without an answer, as gRPC's TLS port drops it.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from coreserve.server.tls_files import server_context


@dataclass(frozen=True)
class HttpTls:
    """The HTTP server's certificate and key; `mutual`: clients must show a certificate `root_cert` signed."""

    server_cert: Path
    server_key: Path
    root_cert: Path | None = None
    mutual: bool = False

    def context(self) -> ssl.SSLContext:
        """The server side's TLS context; raises TlsFileError naming the flag and file it cannot use."""
        cert, key, root = self.server_cert, self.server_key, self.root_cert
        return server_context(cert, key, root, mutual=self.mutual, flags="--http", alpn="http/1.1")
