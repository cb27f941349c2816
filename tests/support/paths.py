"""Where things are in the repository, for tests."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
EXAMPLES = REPO / "examples" / "model_repository"
# Python models that take their time, so that a test can cancel them or kill their server.
CANCELLATION_MODELS = TESTS / "support" / "servers" / "cancellation_models"


def venv_program(program: str, distribution: str) -> str:
    """The path of a program that a wheel of tests/requirements.txt puts beside the interpreter
    (maybe not on PATH); a missing one fails the test."""
    found = shutil.which(
        program, path=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
    )
    assert found is not None, f"{program} is not installed (PyPI: {distribution}, tests/requirements.txt)"
    return found


def real_tritonserver() -> Path | None:
    """The script that runs the real Triton 2.51: $REAL_TRITONSERVER, else
    `shared/tools/real-tritonserver` beside the checkout or a folder above it (None where absent)."""
    if "REAL_TRITONSERVER" in os.environ:
        return Path(os.environ["REAL_TRITONSERVER"])
    candidates = (folder / "shared" / "tools" / "real-tritonserver" for folder in REPO.parents)
    return next((path for path in candidates if path.is_file()), None)
