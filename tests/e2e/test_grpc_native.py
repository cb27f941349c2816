"""Every test of test_grpc.py again, on `--grpc-server native` (coreserve's own HTTP/2 server)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from test_grpc import *  # noqa: F403  (the tests themselves, collected again here)


@pytest.fixture(scope="module")
def grpc_server_flags() -> list[str]:
    return ["--grpc-server=native"]


@pytest.fixture
def coreserve_server(coreserve_server: Callable[..., Any]) -> Callable[..., Any]:
    """The servers test_grpc.py's own tests start, on the native gRPC server."""

    def start(repository: Any, *args: str, **options: Any) -> Any:
        return coreserve_server(repository, *args, "--grpc-server=native", **options)

    return start


def test_the_native_server_answers(server: Any) -> None:
    """The tests above ran on the native server, not grpc.aio."""
    assert "Started GRPCInferenceService at 127.0.0.1" in server.log
    assert "(native HTTP/2)" in server.log
