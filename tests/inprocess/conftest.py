"""A model repository for the in-process API: an ONNX model, a decoupled Python model, text."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

import coreserve
from support.model_builders import add_sub_model, write_model
from support.paths import CANCELLATION_MODELS, EXAMPLES, TESTS

ADD_SUB = """
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


@pytest.fixture(scope="session")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """add_sub (ONNX, batching), countdown (Python, decoupled), simple_string (ONNX, BYTES), and
    sleepy (0.5 s a request, one instance) and streamer (2 ms a response) that stop when cancelled."""
    root = tmp_path_factory.mktemp("inprocess-models")
    write_model(root, "add_sub", add_sub_model(), ADD_SUB)
    shutil.copytree(TESTS / "plugins" / "python" / "models" / "countdown", root / "countdown")
    shutil.copytree(EXAMPLES / "simple_string", root / "simple_string")
    for name in ("sleepy", "streamer"):  # they stop early once cancelled
        shutil.copytree(CANCELLATION_MODELS / name, root / name)
    return root


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[coreserve.Server]:
    """One in-process server over `repository` for a test module (no ports)."""
    with coreserve.Server(repository, exit_timeout_secs=10) as running:
        yield running
