"""The model repository: finding models and versions, loading them, and their lifecycle."""

from __future__ import annotations

from coreserve.repository.loader import ModelLoader
from coreserve.repository.manager import ModelRepository
from coreserve.repository.model import Model, ModelState, ModelVersion

__all__ = ["Model", "ModelLoader", "ModelRepository", "ModelState", "ModelVersion"]
