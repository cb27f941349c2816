"""Fixtures shared by the whole suite."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import tritonclient.http as httpclient

from support.paths import REPO, TESTS

if TYPE_CHECKING:
    from coreserve.testing import ServerProcess

pytest_plugins = ["coreserve.testing", "support.skip_allowlist"]


def _install(package: Path, target: Path) -> Path:
    """Installs a distribution into a folder of its own, the way a user's pip would."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(package),
        ],
        check=True,
    )
    return target


@pytest.fixture(scope="session")
def echo_backend_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A site folder holding the example `echo` backend distribution (examples/backends/echo);
    put it on PYTHONPATH."""
    return _install(REPO / "examples" / "backends" / "echo", tmp_path_factory.mktemp("echo-site"))


@pytest.fixture(scope="session")
def broken_plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A site folder holding a plugin distribution whose module fails to import."""
    return _install(TESTS / "fixtures" / "broken_plugin", tmp_path_factory.mktemp("broken-site"))


@pytest.fixture(scope="session")
def gpu_report_backend_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A site folder holding the `gpu_report` backend, which reports the GPUs $GPU_REPORT_GPUS lists."""
    return _install(TESTS / "fixtures" / "gpu_report_backend", tmp_path_factory.mktemp("gpu-report-site"))


@pytest.fixture(scope="session")
def wheelhouse() -> Path:
    """A folder of wheels, $CORESERVE_WHEELHOUSE, from which the tests that make fresh venvs install
    with no package index: what core-server, plugin-openvino and plugin-torch need, torch, numpy
    and hatchling (.ci/install-test-tools builds it)."""
    named = os.environ.get("CORESERVE_WHEELHOUSE")
    if not named:
        pytest.skip("set CORESERVE_WHEELHOUSE to a folder of wheels (.ci/install-test-tools builds one)")
    return Path(named)


@pytest.fixture
def http_client() -> Iterator[Callable[[ServerProcess], httpclient.InferenceServerClient]]:
    """Makes tritonclient HTTP clients for servers and closes them when the test ends."""
    clients: list[httpclient.InferenceServerClient] = []

    def connect(server: ServerProcess) -> httpclient.InferenceServerClient:
        client = httpclient.InferenceServerClient(server.http_url)
        clients.append(client)
        return client

    yield connect
    for client in clients:
        client.close()


@pytest.fixture
def short_temp() -> Iterator[Path]:
    """A temp folder of a short path, for a server's TMPDIR (a pytest tmp_path is too long for
    the workers' Unix sockets)."""
    folder = Path(tempfile.mkdtemp(prefix="cs-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)
