"""What processes killed before they could clean up left in shared memory.

Each process removes the files it writes in SHM_DIR: a stub's segments and start mark when it
exits, an instance's segments when it unloads. A process killed (SIGKILL, the OOM killer, a
worker of several that hung) cannot: a worker's own segments and those of its stubs, which die
with it, stay in /dev/shm, a tmpfs of a few tens of MiB in a container, until the machine
restarts. Each file is named after the process that writes it ("coreserve-<owner>-<pid>-<n>",
"coreserve-stub-<pid>-started"), so the first Python model a process loads removes those whose
process is gone. A file of a process that lives (another server's, or a pid used again since)
stays.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from pathlib import Path

from coreserve_python.ipc import SHM_DIR

logger = logging.getLogger("coreserve.backend.python")

_WRITTEN_HERE = re.compile(r"coreserve-[A-Za-z0-9_.-]*?-([0-9]+)-(?:[0-9]+|started)")


def remove_files_of_dead_processes(folder: Path = SHM_DIR) -> int:
    """Removes the segments and start marks in `folder` whose process has exited; how many."""
    removed = 0
    for path in folder.glob("coreserve-*"):
        match = _WRITTEN_HERE.fullmatch(path.name)
        if match is None or _alive(int(match[1])):
            continue
        with contextlib.suppress(FileNotFoundError):  # (its process's parent removed it meanwhile)
            path.unlink()
            removed += 1
    if removed:
        logger.warning(
            "removed %d shared memory file(s) in %s that killed processes had left behind", removed, folder
        )
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True
