"""Which requests a stub has started: the last one's key, in 8 bytes of shared memory.

A stub runs its executions one at a time, in the order it was handed them; the server may hand
it several ahead (`pipeline_depth`). When the stub dies, the server must tell the requests the
model may have seen (they fail: running them again could repeat what they did) from those
still waiting in the stub's socket (they go back to the queue). Keys grow with the order of the
executions, so one number tells: the key of the last request of the execution the stub started
last. The stub writes it before it calls the model's execute(), with a store into memory that
the server maps too (no message per execution); the server reads it once the stub has died.
Standard library only.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

_KEY = struct.Struct("q")  # native, as the stub's memoryview reads it
NONE_STARTED = -1


class StartMark:
    """The server's side: creates the mark for one stub and reads it after the stub died."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.unlink(missing_ok=True)  # one a server killed long ago left for a pid reused since
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, _KEY.size)
            self._map: mmap.mmap | None = mmap.mmap(fd, _KEY.size)
        finally:
            os.close(fd)
        _KEY.pack_into(self._map, 0, NONE_STARTED)

    def last_started(self) -> int:
        """The key of the last request the stub started (NONE_STARTED before its first)."""
        if self._map is None:
            return NONE_STARTED
        return int(_KEY.unpack_from(self._map, 0)[0])

    def unlink(self) -> None:
        """Removes the file once the stub has mapped it (the mappings stay)."""
        self.path.unlink(missing_ok=True)

    def close(self) -> None:
        self.unlink()
        if self._map is not None:
            self._map.close()
            self._map = None


def open_start_mark(path: str | None) -> memoryview:
    """The stub's side: the mark as a one-element int64 view (`view[0] = key`).

    Without a path (a stub that runs no executions for a server) a private one.
    """
    if path is None:
        return memoryview(bytearray(_KEY.size)).cast("q")
    fd = os.open(path, os.O_RDWR)
    try:
        mapped = mmap.mmap(fd, _KEY.size)
    finally:
        os.close(fd)
    return memoryview(mapped).cast("q")
