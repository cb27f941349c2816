"""What the TensorFlow tests share: the models built by tf_model_builders.py, and the GraphDef's config."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

BUILDERS = Path(__file__).with_name("tf_model_builders.py")
GRAPHDEF_CONFIG = """
platform: "tensorflow_graphdef"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


# README's test command installs both. Only the servers and the builder's process import TensorFlow
# (slow to import): here a missing one is looked for, and is an error.
for _module in ("coreserve_tensorflow", "tensorflow"):
    if importlib.util.find_spec(_module) is None:
        raise ModuleNotFoundError(
            f"{_module} is not installed (pip install ./plugins/tensorflow)", name=_module
        )


_built: list[Path] = []


def built_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding every test model (<name>/1/...), built once per test session with
    TensorFlow in a process of its own; copy what you change."""
    if not _built:
        target = tmp_path_factory.mktemp("tf-built")
        subprocess.run(
            [sys.executable, str(BUILDERS), str(target)], check=True, capture_output=True, timeout=240
        )
        _built.append(target)
    return _built[0]
