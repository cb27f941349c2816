"""Certificates that TLS tests make: a root authority, a server, a client and a stranger's client."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass
class Identity:
    """A certificate and its key, as PEM files."""

    cert: Path
    key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _issue(
    folder: Path,
    label: str,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None,
    *,
    server: bool = False,
) -> tuple[Identity, x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A certificate for `label`, signed by `issuer` (None: a self-signed authority)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(label))
        .issuer_name(issuer[0].subject if issuer else _name(label))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if server:
        names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(issuer[1] if issuer else key, hashes.SHA256())
    identity = Identity(folder / f"{label}.crt", folder / f"{label}.key")
    identity.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    identity.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return identity, cert, key


@dataclass
class Pki:
    root: Identity
    server: Identity
    client: Identity
    stranger: Identity  # a client certificate from another authority


def make_pki(folder: Path) -> Pki:
    """A root authority and the certificates it signs (the server's names localhost and 127.0.0.1)."""
    root, root_cert, root_key = _issue(folder, "root", None)
    server, _, _ = _issue(folder, "server", (root_cert, root_key), server=True)
    client, _, _ = _issue(folder, "client", (root_cert, root_key))
    _, other_cert, other_key = _issue(folder, "other-root", None)
    stranger, _, _ = _issue(folder, "stranger", (other_cert, other_key))
    return Pki(root, server, client, stranger)


def tls_flags(pki: Pki, protocol: str, *, mutual: bool = False) -> list[str]:
    """The flags that serve `protocol` ("http" or "grpc") over TLS with these certificates."""
    return [
        f"--{protocol}-use-ssl-mutual=true" if mutual else f"--{protocol}-use-ssl=true",
        f"--{protocol}-server-cert={pki.server.cert}",
        f"--{protocol}-server-key={pki.server.key}",
        f"--{protocol}-root-cert={pki.root.cert}",
    ]
