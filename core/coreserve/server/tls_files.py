"""The certificate and key files that the TLS flags of the HTTP and gRPC servers name.

Both servers read them before the models load, so that a wrong path stops the start at once
with one line naming the flag and the file.
"""

from __future__ import annotations

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
