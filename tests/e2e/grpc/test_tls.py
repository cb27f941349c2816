"""gRPC over TLS: --grpc-use-ssl, --grpc-use-ssl-mutual and their certificate files, with tritonclient.

Each test runs on both gRPC servers (--grpc-server native and grpcio).
"""

from __future__ import annotations

import socket
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerFactory, ServerProcess
from support.model_builders import scale_model, write_model
from support.wire.closing import closed_by_server, still_open
from support.wire.tls_certs import Identity, Pki, tls_flags

SCALE = """
backend: "onnxruntime"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


@pytest.fixture(params=["native", "grpcio"])
def grpc_server(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    write_model(root, "scaled", scale_model(2.0), SCALE)
    return root


def _tls_flags(pki: Pki, grpc_server: str, *, mutual: bool = False) -> list[str]:
    return [f"--grpc-server={grpc_server}", *tls_flags(pki, "grpc", mutual=mutual)]


def _client(server: ServerProcess, pki: Pki, identity: Identity | None) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(
        server.grpc_url,
        ssl=True,
        root_certificates=str(pki.root.cert),
        private_key=str(identity.key) if identity else None,
        certificate_chain=str(identity.cert) if identity else None,
    )


def _scale(client: grpcclient.InferenceServerClient) -> float:
    tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    return float(client.infer("scaled", [tensor], client_timeout=20).as_numpy("OUTPUT0")[0, 0])


def test_tls_serves_clients_that_trust_the_root(
    coreserve_server: ServerFactory, repository: Path, pki: Pki, grpc_server: str
) -> None:
    server = coreserve_server(repository, *_tls_flags(pki, grpc_server))
    assert ("(native HTTP/2 over TLS)" in server.log) == (grpc_server == "native")
    client = _client(server, pki, None)
    try:
        assert client.is_server_ready(client_timeout=20)
        assert _scale(client) == 2.0
    finally:
        client.close()
    plain = grpcclient.InferenceServerClient(server.grpc_url)
    try:  # a client speaking plaintext to a TLS port gets no answer
        with pytest.raises(InferenceServerException) as info:
            plain.is_server_live(client_timeout=10)
        assert info.value.status() == "StatusCode.UNAVAILABLE"
    finally:
        plain.close()


def test_a_client_that_never_starts_its_handshake_is_dropped(
    coreserve_server: ServerFactory, repository: Path, pki: Pki, grpc_server: str
) -> None:
    flags = [*_tls_flags(pki, grpc_server), "--grpc-handshake-timeout-secs=0.5"]
    server = coreserve_server(repository, *flags)
    host, port = server.grpc_url.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as silent:
        assert still_open(silent)  # not closed at once
        assert closed_by_server(silent, 30.0)  # but once the handshake's time ran out
    client = _client(server, pki, None)
    try:
        assert _scale(client) == 2.0
    finally:
        client.close()
    assert "Traceback" not in server.log, server.log[-3000:]


def test_connections_that_fail_their_handshake_leave_nothing_behind(
    coreserve_server: ServerFactory, repository: Path, pki: Pki, grpc_server: str
) -> None:
    # They were kept for good (memory) and made the stop fail (exit 1, a traceback).
    server = coreserve_server(repository, *_tls_flags(pki, grpc_server))
    host, port = server.grpc_url.rsplit(":", 1)
    for _ in range(20):
        socket.create_connection((host, int(port))).close()
    client = _client(server, pki, None)
    try:
        assert _scale(client) == 2.0
    finally:
        client.close()
    assert server.stop() == 0
    assert "Traceback" not in server.log, server.log[-3000:]


def test_mutual_tls_wants_a_client_certificate_the_root_signed(
    coreserve_server: ServerFactory, repository: Path, pki: Pki, grpc_server: str
) -> None:
    server = coreserve_server(repository, *_tls_flags(pki, grpc_server, mutual=True))
    client = _client(server, pki, pki.client)
    try:
        assert _scale(client) == 2.0
    finally:
        client.close()
    for identity in (None, pki.stranger):
        refused = _client(server, pki, identity)
        try:
            with pytest.raises(InferenceServerException) as info:
                refused.is_server_live(client_timeout=10)
            assert info.value.status() == "StatusCode.UNAVAILABLE"
        finally:
            refused.close()
    # HTTP is not behind TLS, and the refused handshakes left the server serving.
    assert "Traceback" not in server.log
    client = _client(server, pki, pki.client)
    try:
        assert client.is_server_ready(client_timeout=20)
    finally:
        client.close()


@pytest.mark.parametrize(
    ("which", "expected"),
    [
        ("missing-cert", "cannot read --grpc-server-cert file"),
        ("missing-key", "cannot read --grpc-server-key file"),
        ("not-pem", "holds no PEM data"),
        ("mutual-without-root", "--grpc-use-ssl-mutual needs --grpc-root-cert"),
    ],
)
def test_unusable_certificate_files_stop_the_start_clearly(
    repository: Path, pki: Pki, tmp_path: Path, which: str, expected: str, grpc_server: str
) -> None:
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello")
    flags = {
        "missing-cert": [
            "--grpc-use-ssl=true",
            f"--grpc-server-cert={tmp_path / 'nope.crt'}",
            f"--grpc-server-key={pki.server.key}",
        ],
        "missing-key": [
            "--grpc-use-ssl=true",
            f"--grpc-server-cert={pki.server.cert}",
            f"--grpc-server-key={tmp_path / 'nope.key'}",
        ],
        "not-pem": [
            "--grpc-use-ssl=true",
            f"--grpc-server-cert={not_pem}",
            f"--grpc-server-key={pki.server.key}",
        ],
        "mutual-without-root": [
            "--grpc-use-ssl-mutual=true",
            f"--grpc-server-cert={pki.server.cert}",
            f"--grpc-server-key={pki.server.key}",
        ],
    }[which]
    server = ServerProcess([repository], [f"--grpc-server={grpc_server}", *flags])
    with pytest.raises(RuntimeError, match="exited with 1"):
        server.start()
    assert expected in server.log
    assert "Traceback" not in server.log
    server.close()
