"""Fixtures shared by the whole suite."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from paths import TESTS

pytest_plugins = ["coreserve.testing"]


def _install(package: Path, target: Path) -> Path:
    """Installs a distribution into a folder of its own, the way a user's pip would."""
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--target", str(target), str(package)],
        check=True,
    )
    return target


@pytest.fixture(scope="session")
def echo_backend_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A site folder holding the third-party `echo` backend distribution; put it on PYTHONPATH."""
    return _install(TESTS / "fixtures" / "echo_backend", tmp_path_factory.mktemp("echo-site"))


@pytest.fixture(scope="session")
def broken_plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A site folder holding a plugin distribution whose module fails to import."""
    return _install(TESTS / "fixtures" / "broken_plugin", tmp_path_factory.mktemp("broken-site"))
