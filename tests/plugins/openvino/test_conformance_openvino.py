"""The OpenVINO backend keeps the backend contract (coreserve.testing's conformance suite)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_openvino_backend import ir_add_mul

from coreserve.testing import BackendConformance
from support.model_builders import add_sub_model, write_model


class TestOpenVinoBackendConformance(BackendConformance):
    model_names = ("ir_auto", "from_onnx")

    @pytest.fixture(scope="class")
    @classmethod
    def conformance_repository(cls, tmp_path_factory: pytest.TempPathFactory) -> Path:
        root = tmp_path_factory.mktemp("openvino-conformance")
        ir_add_mul(root / "ir_auto" / "1")  # the configuration is completed from the IR
        (root / "ir_auto" / "config.pbtxt").write_text('backend: "openvino"')
        write_model(
            root,
            "from_onnx",
            add_sub_model("FP32", ["batch", 4]),
            'backend: "openvino"\ndefault_model_filename: "model.onnx"',
        )
        return root
