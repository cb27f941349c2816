"""Which worker a process is: the supervisor puts it in the worker's environment."""

from __future__ import annotations

import os
from dataclasses import dataclass

WORKER_ENV = "CORESERVE_WORKER"  # "INDEX/COUNT/SOCKET"


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
