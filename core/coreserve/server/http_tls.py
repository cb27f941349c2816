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

from coreserve.server.tls_files import TlsFileError, read_pem


@dataclass(frozen=True)
class HttpTls:
    """The HTTP server's certificate and key; `mutual`: clients must show a certificate `root_cert` signed."""

    server_cert: Path
    server_key: Path
    root_cert: Path | None = None
    mutual: bool = False

    def context(self) -> ssl.SSLContext:
        """The server side's TLS context; raises TlsFileError naming the flag and file it cannot use."""
        read_pem(self.server_cert, "--http-server-cert")
        read_pem(self.server_key, "--http-server-key")
        root = read_pem(self.root_cert, "--http-root-cert") if self.root_cert is not None else None
        if self.mutual and root is None:
            raise TlsFileError("--http-use-ssl-mutual needs --http-root-cert to check client certificates")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["http/1.1"])
        try:
            context.load_cert_chain(self.server_cert, self.server_key)
        except ssl.SSLError as exc:
            raise TlsFileError(
                f"--http-server-cert '{self.server_cert}' and --http-server-key '{self.server_key}' "
                f"are not a certificate and its key: {exc.reason or exc}"
            ) from None
        if root is not None:
            try:
                context.load_verify_locations(cadata=root.decode("ascii", errors="replace"))
            except ssl.SSLError as exc:
                reason = exc.reason or exc
                raise TlsFileError(
                    f"--http-root-cert file '{self.root_cert}' holds no usable certificate: {reason}"
                ) from None
        context.verify_mode = ssl.CERT_REQUIRED if self.mutual else ssl.CERT_NONE
        return context
