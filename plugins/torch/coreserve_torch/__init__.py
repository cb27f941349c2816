"""coreserve's PyTorch backend (`pytorch`, platform `pytorch_libtorch`)."""

from __future__ import annotations

from coreserve.backend import BackendRegistry, hookimpl
from coreserve_torch._backend import TorchBackend

__all__ = ["TorchBackend"]


@hookimpl
def coreserve_register_backends(register: BackendRegistry) -> None:
    register.add(TorchBackend())
