"""The Python backend keeps the backend contract (coreserve.testing's conformance suite)."""

from __future__ import annotations

from coreserve.testing import BackendConformance
from paths import TESTS

MODELS = TESTS / "plugins" / "python" / "models"


class TestPythonBackendConformance(BackendConformance):
    # An ordinary batching model on two instances, a decoupled one, one whose model.py completes its config.
    model_folders = [MODELS / "add_one", MODELS / "countdown", MODELS / "autocomplete"]
