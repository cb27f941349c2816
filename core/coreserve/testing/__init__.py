"""A test kit for coreserve and for backend authors; a pytest plugin that pytest loads by itself.

core-server declares it under the `pytest11` entry point, so wherever core-server is installed
its fixtures are there without `pytest_plugins`:

- `coreserve_server` starts real `coreserve` processes on free loopback ports::

      def test_my_backend(coreserve_server, tmp_path):
          server = coreserve_server(tmp_path / "models")
          client = tritonclient.http.InferenceServerClient(server.http_url)

- `BackendConformance` is the conformance suite: subclass it in a backend's tests and point it
  at the model folders the backend ships; every rule a backend must keep becomes a test that
  runs in-process (no ports)::

      from coreserve.testing import BackendConformance

      class TestMyBackend(BackendConformance):
          model_folders = [Path(__file__).parent / "models" / "my_model"]

Importing this module stays light (pytest loads it in every session): the conformance suite
and the in-process server are imported when first used.

Layer 8: may import anything of coreserve.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from coreserve.testing._process import SERVICES, ServerFactory, ServerProcess, coreserve_server

if TYPE_CHECKING:
    from coreserve.testing._conformance import BackendConformance, ConformanceFailure
    from coreserve.testing._inprocess import InProcessServer

__all__ = [
    "SERVICES",
    "BackendConformance",
    "ConformanceFailure",
    "InProcessServer",
    "ServerFactory",
    "ServerProcess",
    "coreserve_server",
]

_LAZY = {
    "BackendConformance": "coreserve.testing._conformance",
    "ConformanceFailure": "coreserve.testing._conformance",
    "InProcessServer": "coreserve.testing._inprocess",
}


def __getattr__(name: str) -> Any:
    """Imports the conformance suite and the in-process server when first asked for."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'coreserve.testing' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
