"""Which worker a process is: the supervisor puts it in the worker's environment."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

WORKER_ENV = "CORESERVE_WORKER"  # "INDEX/COUNT/SOCKET"
SOCKET_PATH_MAX = 107  # the bytes of a Unix socket's path, on Linux (108 with its NUL)
# The longest name in the supervisor's folder ("owner.sock" too), and the folder's own name.
SOCKET_NAME = "supervisor.sock"
FOLDER_PREFIX = "coreserve-workers-"


@dataclass(frozen=True)
class WorkerRole:
    index: int  # 0 .. count - 1
    count: int
    socket: str  # the supervisor's Unix socket

    def encode(self) -> str:
        return f"{self.index}/{self.count}/{self.socket}"

    @classmethod
    def from_environment(cls) -> WorkerRole | None:
        """This process's role; None in a server that is not a worker. The variable is taken
        out of the environment: the worker's own children (model stubs) are no workers."""
        value = os.environ.pop(WORKER_ENV, None)
        if not value:
            return None
        index, count, socket = value.split("/", 2)
        return cls(int(index), int(count), socket)

    def own_cache_folder(self) -> Path:
        """The cache folder this worker makes when it is given none: see `cache_folder`."""
        folder = cache_folder(self.socket, os.getpid())
        folder.mkdir(mode=0o700, exist_ok=True)  # (a pid used again before its folder went)
        return folder


@contextlib.contextmanager
def supervisor_socket() -> Iterator[str]:
    """The path of the supervisor's socket, in a folder of its own (worker 0's socket and each
    worker's cache folder go beside it) that is removed with all in it at the end. The folder is
    made in the system temp folder, or in /tmp where that path is too long for a socket's (as
    CPython's multiprocessing does), rather than failing to start."""
    base = tempfile.gettempdir()
    longest = Path(base, FOLDER_PREFIX + "x" * 8, SOCKET_NAME)  # (mkdtemp's names: 8 characters)
    if len(os.fsencode(longest)) > SOCKET_PATH_MAX:
        logger.warning(
            "the temp folder %s is too long a path for the workers' Unix sockets; their folder is "
            "made in /tmp", base
        )  # fmt: skip
        base = "/tmp"
    with tempfile.TemporaryDirectory(prefix=FOLDER_PREFIX, dir=base) as folder:
        yield str(Path(folder) / SOCKET_NAME)


def cache_folder(socket: str, pid: int) -> Path:
    """Worker process `pid`'s own cache folder, beside the supervisor's socket: the supervisor
    removes it when the worker ends (one killed cannot), and it goes with the supervisor's."""
    return Path(socket).parent / f"cache-{pid}"


def remove_cache_folder(socket: str, pid: int) -> None:
    shutil.rmtree(cache_folder(socket, pid), ignore_errors=True)
