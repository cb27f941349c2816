"""The example backend and the skeleton `coreserve new-backend` writes pass their own tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from coreserve.cli._command import main
from coreserve.cli.new_backend import write_skeleton
from support.paths import REPO

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


def _files(folder: Path) -> dict[str, str]:
    """The files a backend distribution consists of (no build outputs), by relative path."""
    skipped = ("build", "__pycache__", ".pytest_cache")
    return {
        path.relative_to(folder).as_posix(): path.read_text()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
        and not any(part in skipped or part.endswith(".egg-info") for part in path.relative_to(folder).parts)
    }


def test_the_echo_example_is_what_new_backend_writes(tmp_path: Path) -> None:
    write_skeleton("echo", tmp_path / "echo")
    assert _files(tmp_path / "echo") == _files(ECHO), (
        "examples/backends/echo differs from `coreserve new-backend echo`: change the template in "
        "core/coreserve/cli/new_backend/template, then write the example again with the command"
    )


def test_a_new_backend_passes_its_tests_as_written(tmp_path: Path) -> None:
    directory = tmp_path / "coreserve-my-format-backend"
    result = subprocess.run(
        [sys.executable, "-m", "coreserve", "new-backend", "my_format", "--directory", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "wrote 8 files of coreserve-my-format-backend" in result.stdout
    files = _files(directory)
    assert "coreserve_my_format/backend.py" in files and "models/my_format/1/model.my_format" in files
    assert "class MyFormatBackend(BaseBackend):" in files["coreserve_my_format/backend.py"]
    assert 'my_format = "coreserve_my_format"' in files["pyproject.toml"]
    tests = run_own_tests(directory)
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert "11 passed" in tests.stdout, tests.stdout


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["new-backend", "My-Format"], "must start with a lowercase letter"),
        (["new-backend", "9lives"], "must start with a lowercase letter"),
        (["new-backend", "fine", "--directory", "{occupied}"], "exists and is not empty"),
    ],
)
def test_new_backend_refuses_bad_names_and_occupied_folders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], arguments: list[str], message: str
) -> None:
    (tmp_path / "occupied").mkdir()
    (tmp_path / "occupied" / "keep.txt").write_text("mine")
    with pytest.raises(SystemExit) as info:
        main([argument.format(occupied=tmp_path / "occupied") for argument in arguments])
    assert info.value.code == 2
    assert message in capsys.readouterr().err
    assert (tmp_path / "occupied" / "keep.txt").read_text() == "mine"
