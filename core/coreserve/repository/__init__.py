"""The model repository: finding models and versions, loading them, and their lifecycle.

Layer 4: may import scheduling, ensembles, the backend API and the layers below; never the
server or its frontends.
"""

from __future__ import annotations

from coreserve.repository._instances import single_copy_reason
from coreserve.repository._loader import ModelLoader
from coreserve.repository._overrides import LoadOverrides, parse_load_parameters
from coreserve.repository.manager import ControlMode, ModelRepository
from coreserve.repository.model import Model, ModelState, ModelVersion
from coreserve.repository.storage._sources import RepositorySource, source_for

__all__ = [
    "ControlMode",
    "LoadOverrides",
    "Model",
    "ModelLoader",
    "ModelRepository",
    "ModelState",
    "ModelVersion",
    "RepositorySource",
    "parse_load_parameters",
    "single_copy_reason",
    "source_for",
]
