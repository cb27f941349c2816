""".ci/run cannot end green unless every test it promises ran: each fault below, injected into a
throwaway copy of the checkout, makes the real script fail at the step that met it, and stop there.

The copy holds what a clone of this working tree would, and shares its .cache (the tools that
.ci/install-test-tools installed there are found, not installed again). These tests run the
installer itself, so pip reaches the package index here as .ci/run does (through pip's cache); the
one that gets as far as pytest finds the requirements in a venv linked to the running one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.paths import REPO, real_tritonserver

REAL_TRITONSERVER = real_tritonserver()
pytestmark = [
    pytest.mark.skipif(
        REAL_TRITONSERVER is None, reason="shared/tools/real-tritonserver (the real Triton) is not here"
    ),
    pytest.mark.timeout(1800),
]


def _copy_checkout(target: Path) -> Path:
    """The files a clone of this working tree holds, with the checkout's .cache beside them."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():  # a deleted file stays listed until it is committed
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    (REPO / ".cache").mkdir(exist_ok=True)
    (target / ".cache").symlink_to(REPO / ".cache")
    return target


@pytest.fixture
def copy(tmp_path: Path) -> Iterator[Path]:
    """A copy of the checkout, removed with the venv .ci/run made in it (gigabytes) when the test ends."""
    yield _copy_checkout(tmp_path / "copy")
    shutil.rmtree(tmp_path / "copy", ignore_errors=True)


def _seed_venv(copy: Path) -> None:
    """Gives the copy a .venv holding what the running venv holds, as hard links, so that
    README's command finds its requirements installed, as a second run of .ci/run on one machine
    does, and installs only the project's own distributions again. What the venv module puts
    there (pip, setuptools) stays the copy's own; the files at the top of site-packages (`.pth`
    files among them, which pip may rewrite) are copied. Where the copy cannot link to the
    running venv (not a venv, another filesystem, another Python), README's command installs it all."""
    if sys.prefix == sys.base_prefix:
        return
    site = Path(sysconfig.get_path("purelib"))
    subprocess.run(["python3", "-m", "venv", str(copy / ".venv")], check=True, timeout=300)
    target = copy / ".venv" / site.relative_to(sys.prefix)
    if not target.is_dir():  # python3 is another version than the one running
        return
    own = {entry.name.partition("-")[0] for entry in target.iterdir()}
    try:
        for entry in site.iterdir():
            if entry.name.partition("-")[0] in own:
                continue
            if entry.is_dir():
                shutil.copytree(entry, target / entry.name, symlinks=True, copy_function=os.link)
            else:
                shutil.copy2(entry, target / entry.name)
    except OSError:  # no links across filesystems: the copy installs its own
        shutil.rmtree(copy / ".venv")


def _run_ci(copy: Path) -> tuple[int, str]:
    """`bash .ci/run` in the copy: its status, and all it printed."""
    environment = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
    environment.pop("CORESERVE_ALLOWED_SKIPS", None)  # the script sets it itself
    environment["REAL_TRITONSERVER"] = str(REAL_TRITONSERVER)
    run = subprocess.run(
        ["bash", ".ci/run"], cwd=copy, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=1700,
    )  # fmt: skip
    return run.returncode, run.stdout


def _steps(output: str) -> list[str]:
    return [line.removeprefix("ci: ") for line in output.splitlines() if line.startswith("ci: ")]


def test_a_pip_install_that_fails_stops_the_run_before_the_tests(copy: Path) -> None:
    requirements = copy / "tests" / "requirements.txt"
    requirements.write_text(requirements.read_text() + "coreserve-no-such-distribution==1.0\n")
    status, output = _run_ci(copy)
    assert status != 0, output[-3000:]
    assert "coreserve-no-such-distribution" in output
    assert _steps(output)[-2:] == ["README's test command", "README's test command failed with status 1"]
    assert "test session starts" not in output  # pytest never ran, and nothing after it either


def test_a_skip_for_a_reason_off_the_allow_list_fails_the_run(copy: Path) -> None:
    # A suite of three tests: one passes, one skips for want of a GPU (on the list), one for
    # want of a program that an install should have brought (off it).
    shutil.rmtree(copy / "tests")
    (copy / "tests").mkdir()
    for helper in ("conftest.py", "requirements.txt"):
        shutil.copy2(REPO / "tests" / helper, copy / "tests" / helper)
    shutil.copytree(
        REPO / "tests" / "support", copy / "tests" / "support", ignore=shutil.ignore_patterns("__pycache__")
    )
    (copy / "tests" / "test_injected.py").write_text(
        "import pytest\n\n\n"
        "def test_runs() -> None:\n    assert 1 + 1 == 2\n\n\n"
        '@pytest.mark.skip(reason="no GPU: this machine has none")\n'
        "def test_on_a_gpu() -> None:\n    pass\n\n\n"
        "def test_with_redis() -> None:\n"
        '    pytest.skip("redis-server is not installed")\n'
    )
    _seed_venv(copy)
    status, output = _run_ci(copy)
    assert status != 0, output[-3000:]
    assert "1 passed, 2 skipped" in output
    assert "tests/test_injected.py::test_with_redis: redis-server is not installed" in output
    assert "test_injected.py::test_on_a_gpu:" not in output
    assert _steps(output)[-1].startswith("README's test command failed")


def test_a_system_program_that_does_not_install_stops_the_run(copy: Path) -> None:
    programs = copy / ".ci" / "system-programs"
    programs.write_text("coreserve-no-such-program coreserve-no-such-package\n" + programs.read_text())
    status, output = _run_ci(copy)
    assert status != 0, output[-3000:]
    assert "coreserve-no-such-package" in _steps(output)[-1]
    assert "README's test command" not in _steps(output)
