"""A model of two versions whose answers say which version served: version V scales by V."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.model_builders import scale_model, write_model

SCALED = """
backend: "onnxruntime"
max_batch_size: 8
version_policy: { all { } }
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def write_versions(
    root: Path, name: str = "scaled", config: str = SCALED, versions: tuple[int, ...] = (1, 2)
) -> Path:
    """<root>/<name> with one ONNX model per version, version V multiplying its input by V."""
    for version in versions:
        write_model(
            root, name, scale_model(float(version)), config if version == versions[0] else None, (version,)
        )
    return root


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    return write_versions(tmp_path / "models")


# One request of a [1, 4] FP32 input INPUT0 of ones, as JSON (both test models take it).
INFER_BODY = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 1, 1, 1]}]}
)

BEHAVING = """
backend: "python"
max_batch_size: 8
version_policy: { all { } }
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""
# A Python model whose versions behave as their folder's BEHAVIOUR file says: "scale F" answers
# the input times F, "fail" answers an error, "sleep S" answers the input after S seconds.
BEHAVING_MODEL = """
import time
from pathlib import Path

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        folder = Path(args["model_repository"]) / args["model_version"]
        self.kind, _, value = (folder / "BEHAVIOUR").read_text().strip().partition(" ")
        self.value = float(value or 0)

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if self.kind == "fail":
                error = pb_utils.TritonError("this version fails on purpose")
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            if self.kind == "sleep":
                time.sleep(self.value)
            factor = self.value if self.kind == "scale" else 1.0
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x * factor)]))
        return responses
"""


def write_behaving(root: Path, name: str, behaviours: dict[int, str]) -> Path:
    """<root>/<name>: a Python model whose version V behaves as `behaviours[V]` says."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(BEHAVING)
    for version, behaviour in behaviours.items():
        (folder / str(version)).mkdir(exist_ok=True)
        (folder / str(version) / "model.py").write_text(BEHAVING_MODEL)
        (folder / str(version) / "BEHAVIOUR").write_text(behaviour)
    return root
