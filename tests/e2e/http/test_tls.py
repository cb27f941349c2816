"""HTTP over TLS: --http-use-ssl, --http-use-ssl-mutual and their certificate files, with tritonclient.

Triton's HTTP server has no TLS; these flags are coreserve's, named after the --grpc-use-ssl ones.
Clients that cannot finish a handshake (plain HTTP, no certificate or a stranger's under mutual
TLS, a connection that sends nothing) are dropped without breaking the service for others.
"""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from coreserve.testing import ServerFactory, ServerProcess
from support.model_builders import scale_model, write_model
from support.wire.closing import still_open
from support.wire.tls_certs import Identity, Pki, tls_flags

SCALE = """
backend: "onnxruntime"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
READY = b"GET /v2/health/ready HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    write_model(root, "scaled", scale_model(2.0), SCALE)
    return root


def _tls_flags(pki: Pki, *, mutual: bool = False) -> list[str]:
    return tls_flags(pki, "http", mutual=mutual)


def _client(server: ServerProcess, pki: Pki, identity: Identity | None) -> httpclient.InferenceServerClient:
    options = {"ca_certs": str(pki.root.cert)}
    if identity is not None:
        options |= {"certfile": str(identity.cert), "keyfile": str(identity.key)}
    return httpclient.InferenceServerClient(
        server.http_url, ssl=True, ssl_options=options, connection_timeout=20, network_timeout=20
    )


def _scale(client: httpclient.InferenceServerClient) -> float:
    tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32), binary_data=True)
    return float(client.infer("scaled", [tensor]).as_numpy("OUTPUT0")[0, 0])


def _tls_ready(server: ServerProcess, pki: Pki, identity: Identity | None = None) -> bytes:
    """The first line of /v2/health/ready's answer over a raw TLS connection."""
    context = ssl.create_default_context(cafile=str(pki.root.cert))
    if identity is not None:
        context.load_cert_chain(identity.cert, identity.key)
    host, port = server.http_url.split(":")
    raw = socket.create_connection((host, int(port)), timeout=20)
    with raw, context.wrap_socket(raw, server_hostname=host) as tls:
        tls.sendall(READY)
        return tls.recv(4096).split(b"\r\n", 1)[0]


def test_https_serves_clients_that_trust_the_root(
    coreserve_server: ServerFactory, repository: Path, pki: Pki
) -> None:
    server = coreserve_server(repository, *_tls_flags(pki))
    assert "Started HTTPService at 127.0.0.1:" in server.log and "(TLS)" in server.log
    client = _client(server, pki, None)
    try:
        assert client.is_server_ready()
        assert _scale(client) == 2.0
        assert client.get_model_metadata("scaled")["name"] == "scaled"
    finally:
        client.close()
    # A client that speaks plain HTTP to the TLS port fails its handshake and gets no answer;
    # the server keeps serving the others and logs no traceback.
    host, port = server.http_url.split(":")
    with socket.create_connection((host, int(port)), timeout=20) as plain:
        plain.sendall(READY)
        assert not plain.recv(4096).startswith(b"HTTP/1.1 200")
    assert _tls_ready(server, pki) == b"HTTP/1.1 200 OK"
    assert "Traceback" not in server.log


def test_a_client_that_does_not_trust_the_server_is_refused(
    coreserve_server: ServerFactory, repository: Path, pki: Pki
) -> None:
    server = coreserve_server(repository, *_tls_flags(pki))
    host, port = server.http_url.split(":")
    context = ssl.create_default_context(cafile=str(pki.stranger.cert))  # not the server's root
    with (
        socket.create_connection((host, int(port)), timeout=20) as raw,
        pytest.raises(ssl.SSLCertVerificationError),
    ):
        context.wrap_socket(raw, server_hostname=host)
    assert _tls_ready(server, pki) == b"HTTP/1.1 200 OK"


def test_mutual_tls_wants_a_client_certificate_the_root_signed(
    coreserve_server: ServerFactory, repository: Path, pki: Pki
) -> None:
    server = coreserve_server(repository, *_tls_flags(pki, mutual=True))
    client = _client(server, pki, pki.client)
    try:
        assert _scale(client) == 2.0
    finally:
        client.close()
    for identity in (None, pki.stranger):
        # TLS 1.3 finishes the client's side of the handshake before the server has read its
        # certificate: the refusal arrives as an alert, or a closed connection, on first use.
        try:
            line = _tls_ready(server, pki, identity)
        except (ssl.SSLError, ConnectionError):
            line = b""
        assert line == b"", (identity, line)
    assert _tls_ready(server, pki, pki.client) == b"HTTP/1.1 200 OK"
    assert "Traceback" not in server.log


def test_a_connection_that_never_starts_its_handshake_is_dropped(
    coreserve_server: ServerFactory, repository: Path, pki: Pki
) -> None:
    # A test of the timeout itself: the silent connection is closed once the handshake's 1 s has
    # run out, not at once (it is open right after it connects, and others are served while it
    # is) and not never (the server closes it before the client's deadline of 30 s).
    server = coreserve_server(repository, *_tls_flags(pki), "--http-header-timeout-secs=1")
    host, port = server.http_url.split(":")
    with socket.create_connection((host, int(port)), timeout=30) as silent:
        assert still_open(silent)
        assert _tls_ready(server, pki) == b"HTTP/1.1 200 OK"  # served meanwhile
        assert silent.recv(4096) == b""  # closed by the server: the handshake timed out
    assert "Traceback" not in server.log


def test_grpc_stays_plain_when_only_http_uses_tls(
    coreserve_server: ServerFactory, repository: Path, pki: Pki
) -> None:
    import tritonclient.grpc as grpcclient

    server = coreserve_server(repository, *_tls_flags(pki))
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        assert client.is_server_ready(client_timeout=20)
    finally:
        client.close()


@pytest.mark.parametrize(
    ("which", "expected"),
    [
        ("missing-cert", "cannot read --http-server-cert file"),
        ("missing-key", "cannot read --http-server-key file"),
        ("not-pem", "--http-server-cert file '{not_pem}' holds no PEM data"),
        ("key-of-another-certificate", "are not a certificate and its key"),
        ("mutual-without-root", "--http-use-ssl-mutual needs --http-root-cert"),
        ("no-key-flag", "--http-use-ssl needs --http-server-cert and --http-server-key"),
    ],
)
def test_unusable_certificate_files_stop_the_start_clearly(
    repository: Path, pki: Pki, tmp_path: Path, which: str, expected: str
) -> None:
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello")
    cert, key = f"--http-server-cert={pki.server.cert}", f"--http-server-key={pki.server.key}"
    flags = {
        "missing-cert": [f"--http-server-cert={tmp_path / 'nope.crt'}", key],
        "missing-key": [cert, f"--http-server-key={tmp_path / 'nope.key'}"],
        "not-pem": [f"--http-server-cert={not_pem}", key],
        "key-of-another-certificate": [cert, f"--http-server-key={pki.client.key}"],
        "mutual-without-root": ["--http-use-ssl-mutual=true", cert, key],
        "no-key-flag": [cert],
    }[which]
    server = ServerProcess([repository], ["--http-use-ssl=true", *flags])
    with pytest.raises(RuntimeError, match=r"exited with [12]"):
        server.start()
    lines = [line for line in server.log.splitlines() if expected.format(not_pem=not_pem) in line]
    assert len(lines) == 1, server.log
    assert "Traceback" not in server.log
    server.close()
