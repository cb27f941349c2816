"""The certificate and key files that the TLS flags of the HTTP and gRPC servers name.

Both servers read them before the models load, so that a wrong path stops the start at once
with one line naming the flag and the file.
"""

from __future__ import annotations

import ssl
from pathlib import Path


class TlsFileError(Exception):
    """A certificate or key file of a TLS flag cannot be used; the message names flag and file."""


def read_pem(path: Path, flag: str) -> bytes:
    """The PEM data of the file that `flag` names; raises TlsFileError when there is none."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TlsFileError(f"cannot read {flag} file '{path}': {exc.strerror}") from None
    if b"-----BEGIN" not in data:
        raise TlsFileError(f"{flag} file '{path}' holds no PEM data")
    return data


def server_context(
    cert: Path, key: Path, root: Path | None, *, mutual: bool, flags: str, alpn: str
) -> ssl.SSLContext:
    """A server's TLS context from the files of the `flags` ("--http", "--grpc") family of flags.

    `mutual`: clients must show a certificate that `root` signed. `alpn`: the one protocol the
    server speaks ("http/1.1", or "h2", which gRPC clients insist on). Raises TlsFileError naming
    the flag and the file it cannot use.
    """
    read_pem(cert, f"{flags}-server-cert")
    read_pem(key, f"{flags}-server-key")
    root_pem = read_pem(root, f"{flags}-root-cert") if root is not None else None
    if mutual and root_pem is None:
        raise TlsFileError(f"{flags}-use-ssl-mutual needs {flags}-root-cert to check client certificates")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols([alpn])
    try:
        context.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        raise TlsFileError(
            f"{flags}-server-cert '{cert}' and {flags}-server-key '{key}' "
            f"are not a certificate and its key: {exc.reason or exc}"
        ) from None
    if root_pem is not None:
        try:
            context.load_verify_locations(cadata=root_pem.decode("ascii", errors="replace"))
        except ssl.SSLError as exc:
            reason = exc.reason or exc
            flag = f"{flags}-root-cert"
            raise TlsFileError(f"{flag} file '{root}' holds no usable certificate: {reason}") from None
    context.verify_mode = ssl.CERT_REQUIRED if mutual else ssl.CERT_NONE
    return context
