"""The echo backend keeps coreserve's backend contract, and its entry point finds it."""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

from coreserve_echo import EchoBackend

from coreserve.backend import BackendRegistry
from coreserve.testing import BackendConformance

HERE = Path(__file__).resolve().parent
DISTRIBUTION = HERE.parent


class TestEchoConformance(BackendConformance):
    """Every rule of the conformance suite, run on the models this distribution ships."""

    model_folders = [DISTRIBUTION / "models" / "echo"]
    # Registered in code, so that the tests pass before the distribution is installed.
    backends = [EchoBackend()]


def test_the_entry_point_registers_the_backend() -> None:
    project = tomllib.loads((DISTRIBUTION / "pyproject.toml").read_text())
    entry_points = project["project"]["entry-points"]["coreserve.backends"]
    registry = BackendRegistry()
    for module_name in entry_points.values():
        importlib.import_module(module_name).coreserve_register_backends(register=registry)
    assert registry.names() == ["echo"]
    assert isinstance(registry.get("echo"), EchoBackend)
