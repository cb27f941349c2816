"""The TensorFlow backend keeps the backend contract (coreserve.testing's conformance suite)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from tf_repository import GRAPHDEF_CONFIG as GRAPHDEF
from tf_repository import built_models

from coreserve.testing import BackendConformance


class TestTensorFlowBackendConformance(BackendConformance):
    model_names = ("affine", "graphdef")

    @pytest.fixture(scope="class")
    @classmethod
    def conformance_repository(cls, tmp_path_factory: pytest.TempPathFactory) -> Path:
        root = tmp_path_factory.mktemp("tf-conformance") / "models"
        shutil.copytree(built_models(tmp_path_factory), root)
        (root / "graphdef" / "config.pbtxt").write_text(GRAPHDEF)
        return root
