"""The TensorFlow backend keeps the backend contract (coreserve.testing's conformance suite)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from coreserve.testing import BackendConformance

pytest.importorskip("coreserve_tensorflow", reason="plugin-tensorflow is not installed")
if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("TensorFlow is not installed (pip install ./plugins/tensorflow)", allow_module_level=True)

BUILDERS = Path(__file__).with_name("tf_model_builders.py")
GRAPHDEF = """
platform: "tensorflow_graphdef"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


class TestTensorFlowBackendConformance(BackendConformance):
    model_names = ("affine", "graphdef")

    @pytest.fixture(scope="class")
    @classmethod
    def conformance_repository(cls, tmp_path_factory: pytest.TempPathFactory) -> Path:
        root = tmp_path_factory.mktemp("tf-conformance")
        subprocess.run(
            [sys.executable, str(BUILDERS), str(root)], check=True, capture_output=True, timeout=240
        )
        (root / "graphdef" / "config.pbtxt").write_text(GRAPHDEF)
        return root
