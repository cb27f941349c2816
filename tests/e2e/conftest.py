"""Servers shared by the tests of one module (starting a process costs about a second)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import tritonclient.http as httpclient

from coreserve.testing import ServerProcess
from paths import EXAMPLES


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
