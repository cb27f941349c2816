"""coreserve's OpenVINO backend (`openvino`, platform `openvino`)."""

from __future__ import annotations

from coreserve.backend import BackendRegistry, hookimpl
from coreserve_openvino._backend import OpenVinoBackend

__all__ = ["OpenVinoBackend"]


@hookimpl
def coreserve_register_backends(register: BackendRegistry) -> None:
    register.add(OpenVinoBackend())
