"""What killed processes left in shared memory goes; what live processes use stays."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from coreserve_python.server._leftovers import remove_files_of_dead_processes


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_the_files_of_exited_processes_go_and_every_other_file_stays(tmp_path: Path) -> None:
    dead, live = _dead_pid(), os.getpid()
    gone = [
        f"coreserve-my_model_0-{dead}-1",
        f"coreserve-model-with-dashes_2-{dead}-17",  # an owner's dashes and digits
        f"coreserve-stub-{dead}-3",
        f"coreserve-stub-{dead}-started",
    ]
    kept = [
        f"coreserve-my_model_0-{live}-1",
        f"coreserve-stub-{live}-started",
        f"coreserve-faults-{dead}",  # a name of another form (a client's region, say)
        f"other-stub-{dead}-1",
        f"coreserve-stub-{dead}-1.bak",
    ]
    for name in gone + kept:
        (tmp_path / name).write_bytes(b"x")
    assert remove_files_of_dead_processes(tmp_path) == len(gone)
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(kept)
    assert remove_files_of_dead_processes(tmp_path) == 0
