"""coreserve's tree-model backend (`fil`), in the layout and with the parameters of Triton's FIL backend."""

from __future__ import annotations

from coreserve.backend import BackendRegistry, hookimpl
from coreserve_fil._backend import FilBackend

__all__ = ["FilBackend"]


@hookimpl
def coreserve_register_backends(register: BackendRegistry) -> None:
    register.add(FilBackend())
