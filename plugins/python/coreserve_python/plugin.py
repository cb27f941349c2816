"""The entry point of plugin-python: registers the `python` backend and `coreserve python-envs`."""

from __future__ import annotations

from collections.abc import Sequence

from coreserve.backend import BackendRegistry, CommandRegistry, hookimpl
from coreserve_python.server import PythonBackend


@hookimpl
def coreserve_register_backends(register: BackendRegistry) -> None:
    register.add(PythonBackend())


@hookimpl
def coreserve_register_commands(register: CommandRegistry) -> None:
    from coreserve_python._envs_command import HELP

    register.add("python-envs", _python_envs, HELP)


def _python_envs(argv: Sequence[str]) -> int:
    from coreserve_python._envs_command import main

    return main(argv)
