"""Every test of test_frontend.py again, on `--grpc-server native` (coreserve's own HTTP/2 server)."""

from __future__ import annotations

import pytest

from .test_frontend import *  # noqa: F403  (the tests themselves, collected again here)


@pytest.fixture(scope="module")
def grpc_server_flags() -> list[str]:
    return ["--grpc-server=native"]
