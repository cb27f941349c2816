"""The entry point of plugin-python: registers the `python` backend."""

from __future__ import annotations

from coreserve.backend import BackendRegistry, hookimpl
from coreserve_python.server import PythonBackend


@hookimpl
def coreserve_register_backends(register: BackendRegistry) -> None:
    register.add(PythonBackend())
