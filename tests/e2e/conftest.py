"""Servers shared by the tests of one module (starting a process costs about a second)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import tritonclient.http as httpclient

from coreserve.testing import ServerProcess
from support.paths import EXAMPLES

if TYPE_CHECKING:
    from support.wire.tls_certs import Pki


@pytest.fixture
def no_traceback(server: ServerProcess) -> Iterator[None]:
    """Checks after a test that the log of its module's `server` holds no traceback: a client's
    mistake gets its answer, never a traceback (`pytestmark = pytest.mark.usefixtures(...)`)."""
    yield
    assert "Traceback" not in server.log


@pytest.fixture(scope="module")
def examples_server() -> Iterator[ServerProcess]:
    """coreserve over examples/model_repository, as README serves it."""
    server = ServerProcess([EXAMPLES]).start()
    yield server
    server.close()


@pytest.fixture
def examples_client(examples_server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(examples_server.http_url)
    yield client
    client.close()


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """Certificates for the TLS tests (HTTP and gRPC): a root, a server, a client, a stranger."""
    # Imported here: only the TLS tests need cryptography (the GPU machine has none).
    from support.wire.tls_certs import make_pki

    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="session")
def perf_analyzer() -> Path:
    """Triton's own perf_analyzer (tritonclient 2.51's wheel), as $PERF_ANALYZER names it:
    .ci/install-test-tools installs one, and docs/benchmarks.md says how to by hand."""
    named = os.environ.get("PERF_ANALYZER")
    if not named:
        pytest.skip(
            "set PERF_ANALYZER to tritonclient 2.51's perf_analyzer (.ci/install-test-tools installs one)"
        )
    return Path(named)
