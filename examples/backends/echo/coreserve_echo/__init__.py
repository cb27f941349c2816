"""The coreserve backend `echo`: as written, each output is the input at the same position.

The entry point `coreserve.backends: echo = "coreserve_echo"` names this module; coreserve
calls its `coreserve_register_backends` hook once at start-up.
"""

from __future__ import annotations

from coreserve.backend import BackendRegistry, hookimpl
from coreserve_echo.backend import EchoBackend, EchoInstance

__all__ = ["EchoBackend", "EchoInstance"]


@hookimpl
def coreserve_register_backends(register: BackendRegistry) -> None:
    register.add(EchoBackend())
