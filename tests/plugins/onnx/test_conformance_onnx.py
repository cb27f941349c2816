"""The ONNX Runtime backend keeps the backend contract (coreserve.testing's conformance suite)."""

from __future__ import annotations

from pathlib import Path

import pytest

from coreserve.testing import BackendConformance
from support.model_builders import add_sub_model, identity_model, write_model


class TestOnnxBackendConformance(BackendConformance):
    model_names = ("add_sub_auto", "identity_bytes", "identity_fp16")
    unbatched_models = ("identity_fp16",)

    @pytest.fixture(scope="class")
    @classmethod
    def conformance_repository(cls, tmp_path_factory: pytest.TempPathFactory) -> Path:
        root = tmp_path_factory.mktemp("onnx-conformance")
        # Completed from the model file: two outputs, an open batch dimension.
        write_model(root, "add_sub_auto", add_sub_model("FP32", ["batch", 4]), 'backend: "onnxruntime"')
        write_model(
            root,
            "identity_bytes",
            identity_model("BYTES", ["batch", 2]),
            'platform: "onnxruntime_onnx"\nmax_batch_size: 4\n'
            'input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ 2 ] } ]\n'
            'output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ 2 ] } ]\n',
        )
        write_model(root, "identity_fp16", identity_model("FP16", [3]), 'backend: "onnxruntime"')
        return root
