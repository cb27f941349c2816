"""Ensembles: pipelines of models (`platform: "ensemble"`), a built-in backend of the core.

The module is a plugin like any other: `coreserve.backend.plugins.manager` registers it by name.

Layer 3: may import the backend API and the layers below it.
"""

from __future__ import annotations

from coreserve.ensemble._backend import EnsembleBackend, coreserve_register_backends
from coreserve.ensemble._graph import misfit, steps_decoupled

__all__ = ["EnsembleBackend", "coreserve_register_backends", "misfit", "steps_decoupled"]
