"""The PyTorch backend keeps the backend contract (coreserve.testing's conformance suite)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_torch_backend import FP32, _config, _save_script

from coreserve.testing import BackendConformance
from torch_models import AddSub, Double, Halves

# The models load in this process: TorchScript's deprecation (Triton users still have model.pt
# files) must not turn into an error here, as it does not in a server.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")


class TestTorchBackendConformance(BackendConformance):
    model_names = ("scripted", "dict_outputs", "bf16", "exported")

    @pytest.fixture(scope="class")
    @classmethod
    def conformance_repository(cls, tmp_path_factory: pytest.TempPathFactory) -> Path:
        root = tmp_path_factory.mktemp("torch-conformance")
        _save_script(
            root / "scripted", AddSub(), _config([("a", FP32), ("b", FP32)], [("s", FP32), ("d", FP32)])
        )
        _save_script(
            root / "dict_outputs", Halves(), _config([("x", FP32)], [("double", FP32), ("half", FP32)])
        )
        _save_script(root / "bf16", Double(), _config([("x", "TYPE_BF16")], [("y", "TYPE_BF16")]))
        exported = torch.export.export(
            AddSub(),
            (torch.ones(2, 4), torch.ones(2, 4)),
            dynamic_shapes=({0: torch.export.Dim("batch")}, {0: torch.export.Dim("batch")}),
        )
        (root / "exported" / "1").mkdir(parents=True)
        torch.export.save(exported, str(root / "exported" / "1" / "model.pt2"))
        (root / "exported" / "config.pbtxt").write_text(
            'backend: "pytorch"\ndefault_model_filename: "model.pt2"'
        )
        return root
