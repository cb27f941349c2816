"""The TensorRT backend keeps the backend contract (coreserve.testing's conformance suite); needs a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_tensorrt_backend import HAS_GPU, HAS_TENSORRT, PLAN, _build_engine

from coreserve.testing import BackendConformance
from support.model_builders import add_sub_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not (HAS_TENSORRT and HAS_GPU), reason="no TensorRT: needs the tensorrt package and an NVIDIA GPU"
    ),
]


class TestTensorRTBackendConformance(BackendConformance):
    model_names = ("engine",)

    @pytest.fixture(scope="class")
    @classmethod
    def conformance_repository(cls, tmp_path_factory: pytest.TempPathFactory) -> Path:
        root = tmp_path_factory.mktemp("tensorrt-conformance")
        (root / "engine" / "1").mkdir(parents=True)
        _build_engine(
            add_sub_model("FP32", ["batch", 4]).SerializeToString(), root / "engine" / "1" / "model.plan"
        )
        (root / "engine" / "config.pbtxt").write_text(PLAN)
        return root
