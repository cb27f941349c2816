"""The example backend distribution passes its own tests, as an author would run them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from paths import REPO

ECHO = REPO / "examples" / "backends" / "echo"


def run_own_tests(distribution: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Runs `pytest` in a backend distribution's folder, its package importable (not installed)."""
    pythonpath = os.pathsep.join(filter(None, [str(distribution), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=distribution,
        env={**os.environ, "PYTHONPATH": pythonpath},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_the_echo_example_passes_its_conformance_tests() -> None:
    result = run_own_tests(ECHO)
    assert result.returncode == 0, result.stdout + result.stderr
    # Every rule of the suite ran on its model (none skipped), and the entry point test.
    assert "11 passed" in result.stdout, result.stdout
