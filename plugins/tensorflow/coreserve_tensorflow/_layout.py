"""Which TensorFlow format a model is and where its file lies (no TensorFlow import here)."""

from __future__ import annotations

from pathlib import Path

from coreserve import ModelConfig
from coreserve.backend import ModelFiles

SAVEDMODEL, GRAPHDEF = "tensorflow_savedmodel", "tensorflow_graphdef"
FILENAMES = {SAVEDMODEL: "model.savedmodel", GRAPHDEF: "model.graphdef"}


def platform_of(model: ModelFiles, config: ModelConfig) -> str:
    """The configuration's platform; without one, GraphDef when the version holds only a
    model.graphdef (Triton tells them apart the same way)."""
    if config.platform:
        return config.platform
    version = model.version_path
    only_graphdef = (version / FILENAMES[GRAPHDEF]).is_file() and not (
        version / FILENAMES[SAVEDMODEL]
    ).exists()
    return GRAPHDEF if only_graphdef else SAVEDMODEL


def model_path(model: ModelFiles, config: ModelConfig) -> Path:
    """The SavedModel folder or GraphDef file: `default_model_filename`, or the platform's name."""
    platform = platform_of(model, config)
    if model.filename and not (platform == GRAPHDEF and model.filename == FILENAMES[SAVEDMODEL]):
        return model.model_file
    return model.version_path / FILENAMES[platform]
