"""Backends come and go with their distributions: a fresh venv, pip install, pip uninstall."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.paths import REPO

TORCH = "torch==2.13.0"  # the CPU build from local disk; never an unpinned torch


def _run(*command: str | Path, timeout: float = 600) -> str:
    completed = subprocess.run(
        [str(part) for part in command], capture_output=True, text=True, timeout=timeout
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return completed.stdout


def _backends(venv: Path) -> dict[str, str]:
    """`coreserve backends` of the venv: backend name -> distribution."""
    output = _run(venv / "bin" / "coreserve", "backends")
    rows = [
        line.split() for line in output.splitlines()[1:] if line.strip() and not line.startswith("failed")
    ]
    return {row[0]: row[2] for row in rows if len(row) >= 3}


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory, wheelhouse: Path) -> Iterator[Path]:
    """A venv of its own (a gigabyte with torch), removed when the module's tests end."""
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    _run(sys.executable, "-m", "venv", venv)
    _run(
        venv / "bin" / "pip",
        "install",
        "--quiet",
        "--no-index",
        "--find-links",
        wheelhouse,
        REPO / "core",
        REPO / "plugins" / "openvino",
        REPO / "plugins" / "torch",
        TORCH,
    )
    # TensorRT's own wheels need a GPU machine; the plugin installs without them.
    _run(
        venv / "bin" / "pip", "install", "--quiet", "--no-index", "--find-links", wheelhouse, "--no-deps",
        REPO / "plugins" / "tensorrt",
    )  # fmt: skip
    yield venv
    shutil.rmtree(venv, ignore_errors=True)


def test_installed_backends_appear_and_uninstalled_ones_disappear(fresh_venv: Path) -> None:
    assert _backends(fresh_venv) == {
        "ensemble": "core-server",
        "openvino": "plugin-openvino",
        "pytorch": "plugin-torch",
        "tensorrt": "plugin-tensorrt",
    }
    _run(
        fresh_venv / "bin" / "pip",
        "uninstall",
        "--quiet",
        "--yes",
        "plugin-openvino",
        "plugin-torch",
        "plugin-tensorrt",
    )
    assert _backends(fresh_venv) == {"ensemble": "core-server"}
