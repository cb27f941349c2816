"""The system shared-memory regions that clients registered with the server.

A client creates a POSIX shared-memory segment (`shm_open`), registers part of it under a
region name, and then sends tensors by reference to that region. The registry maps each
registered segment once and hands out bounds-checked views of it.

Keys are POSIX shared-memory names and nothing else: an optional leading '/', then one name
without '/', opened as /dev/shm/<name> without following links. A key can never reach a file
elsewhere.

Where a CUDA device is usable, `cuda` holds the CUDA regions (`_cuda`): names
are one namespace for both kinds, as in Triton, and the codecs reach either through `buffer`
and `output_writer`.

Inputs are read through the mapping (no copy); outputs are written with `pwrite` on the
segment's file, never stored through the mapping: a client that truncates its segment while
the model runs would make that store kill the server with SIGBUS, where `pwrite` writes (and
extends) the file.

Unregistering a region that a request still reads or writes is safe: the mapping is closed
at once only when nothing views it; otherwise it stays mapped until the last view (a numpy
array of that request) is released, because Python's mmap refuses to unmap exported memory
and is unmapped when its last reference goes. The segment's file stays open as long as a
request may write to it (until the region is unregistered and no writer holds it).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import stat
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from coreserve.errors import AlreadyExistsError, InvalidArgumentError, NotFoundError, UnsupportedError
from coreserve.server.httpd import open_file_limit
from coreserve.server.shared_memory._cuda import CudaSharedMemory
from coreserve.server.shared_memory._region_table import RegionTable

SHM_DIRECTORY = "/dev/shm"
# Bounds on what clients can make the server hold: every region keeps a mapping and two file
# descriptors open (its own, for outputs, and the one Python's mmap keeps), so the number of
# regions also stays within an eighth of the open-file limit, leaving most to connections and models.
MAX_REGIONS = 1024
MAX_REGION_NAME_LENGTH = 256
MAX_KEY_LENGTH = 255  # NAME_MAX: the longest file name /dev/shm can hold


@dataclass(slots=True, weakref_slot=True)
class _Region:
    name: str
    key: str
    offset: int
    byte_size: int
    mapping: mmap.mmap
    start: int  # where the region begins in `mapping` (which starts on a page boundary)
    fd: int  # the segment's file, which outputs are written to; closed with the last reference

    def __post_init__(self) -> None:
        weakref.finalize(self, os.close, self.fd)

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    def close(self) -> None:
        # A request may still view it: then it is unmapped when its last view is released.
        with contextlib.suppress(BufferError):
            self.mapping.close()


class SystemSharedMemory(RegionTable[_Region]):
    """Registers, lists and unregisters regions; gives the codecs views of them.

    Used from the event loop and from codec threads, hence the lock (held only for lookups).
    """

    kind = "system"

    def __init__(self, max_regions: int | None = None) -> None:
        super().__init__()
        self._max_regions = default_max_regions() if max_regions is None else max_regions
        self.cuda: CudaSharedMemory | None = None  # set where a CUDA device is usable

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        """Registers a CUDA region (a client's cudaIpcMemHandle_t); refused without a GPU."""
        if self.cuda is None:
            raise cuda_shared_memory_unavailable(name)
        _check_name(name)
        with self._lock:
            self._check_room(name)
        self.cuda.register(name, raw_handle, device_id, byte_size)

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Maps `byte_size` bytes at `offset` of the segment `key` under `name`."""
        _check_name(name)
        path = _segment_path(name, key)
        if type(offset) is not int or offset < 0:
            raise InvalidArgumentError(
                f"shared memory region '{name}': offset must be a non-negative integer"
            )
        if type(byte_size) is not int or byte_size <= 0:
            raise InvalidArgumentError(f"shared memory region '{name}': byte_size must be a positive integer")
        with self._lock:
            self._check_room(name)
        region = _map(name, key, path, offset, byte_size)
        with self._lock:
            try:
                self._check_room(name)  # another registration may have taken the name meanwhile
            except Exception:
                region.close()
                raise
            self._regions[name] = region

    def _check_room(self, name: str) -> None:
        if name in self._regions or (self.cuda is not None and self.cuda.has(name)):
            raise AlreadyExistsError(f"shared memory region '{name}' already in manager")
        if len(self._regions) + (self.cuda.count() if self.cuda is not None else 0) >= self._max_regions:
            raise InvalidArgumentError(
                f"cannot register shared memory region '{name}': {self._max_regions} regions are "
                "registered already, the most this server holds; unregister some first"
            )

    def unregister(self, name: str = "") -> None:
        """Unregisters one region, or every region when `name` is empty; unknown names are ignored,
        as Triton ignores them."""
        for region in self._remove(name):
            region.close()

    def buffer(self, region: str, offset: int, byte_size: int) -> memoryview:
        """A read-only view of `byte_size` bytes at `offset` within a registered region."""
        with self._lock:
            found = self._regions.get(region)
            if found is None:
                if self.cuda is not None and self.cuda.has(region):
                    return self.cuda.read(region, offset, byte_size)
                raise NotFoundError(f"Unable to find shared memory region: '{region}'")
            _check_fits(found, offset, byte_size)
            # Taken under the lock: a concurrent unregister then finds the export and leaves
            # the mapping open for this view.
            view = memoryview(found.mapping)[found.start + offset : found.start + offset + byte_size]
        return view.toreadonly()

    def output_writer(self, region: str, offset: int, byte_size: int) -> Callable[[memoryview], None]:
        """The call that writes an output's bytes (at most `byte_size`) at `offset` in a region."""
        if self.cuda is not None and self.cuda.has(region):
            staging, commit = self.cuda.staging(region, offset, byte_size)

            def to_device(data: memoryview) -> None:
                staging[: data.nbytes] = data
                commit()

            return to_device
        with self._lock:
            found = self._regions.get(region)
            if found is None:
                raise NotFoundError(f"Unable to find shared memory region: '{region}'")
            _check_fits(found, offset, byte_size)

        def to_segment(data: memoryview) -> None:
            position = found.offset + offset
            try:
                while data.nbytes:
                    written = os.pwrite(found.fd, data, position)
                    data, position = data[written:], position + written
            except OSError as exc:  # (/dev/shm full, where a truncated segment grows again)
                raise InvalidArgumentError(
                    f"shared memory region '{region}': the output could not be written: {exc.strerror}"
                ) from None

        return to_segment

    def close(self) -> None:
        self.unregister()
        if self.cuda is not None:
            self.cuda.unregister()


def _check_fits(found: _Region, offset: int, byte_size: int) -> None:
    if offset >= found.byte_size:  # Triton's words, each check as Triton makes it
        raise InvalidArgumentError(
            f"Invalid offset for shared memory region: '{found.name}' (offset {offset}, the region "
            f"holds {found.byte_size} bytes)"
        )
    if offset + byte_size > found.byte_size:
        raise InvalidArgumentError(
            f"Invalid offset + byte size for shared memory region: '{found.name}' "
            f"({offset} + {byte_size} is past its {found.byte_size} bytes)"
        )
    # A client that truncates its segment (re-creating it with a smaller size does) would
    # make reading the mapping kill the server with SIGBUS: check it still holds.
    segment_size = found.mapping.size()
    if found.offset + found.byte_size > segment_size:
        raise InvalidArgumentError(
            f"shared memory region '{found.name}': segment '{found.key}' shrank to {segment_size} "
            "bytes after it was registered; unregister the region and register it again"
        )


def default_max_regions() -> int:
    """MAX_REGIONS, or an eighth of the open-file limit when that is smaller."""
    limit = open_file_limit()
    return MAX_REGIONS if limit is None else max(1, min(MAX_REGIONS, limit // 8))


def cuda_shared_memory_unavailable(name: str) -> UnsupportedError:
    """The answer to a CUDA shared-memory registration: this server has no GPU path."""
    return UnsupportedError(
        f"failed to register CUDA shared memory region: '{name}', GPUs not supported: coreserve "
        "offers no CUDA shared memory (no GPU and CUDA runtime here); use system shared memory"
    )


def _check_name(name: str) -> None:
    if not name or len(name) > MAX_REGION_NAME_LENGTH:
        raise InvalidArgumentError(
            f"a shared memory region name must have 1 to {MAX_REGION_NAME_LENGTH} characters, got {len(name)}"
        )


def _segment_path(name: str, key: str) -> str:
    """/dev/shm/<key's name>, for a key that is a POSIX shared-memory name; raises otherwise."""
    if not isinstance(key, str):
        raise InvalidArgumentError(f"shared memory region '{name}': 'key' must be a string")
    bare = key[1:] if key.startswith("/") else key
    if not bare or len(bare) > MAX_KEY_LENGTH or "/" in bare or bare in (".", "..") or "\0" in bare:
        shown = key if len(key) <= 80 else key[:80] + "..."
        raise InvalidArgumentError(
            f"shared memory region '{name}': key {shown!r} is not a POSIX shared memory name "
            f"(an optional leading '/', then 1 to {MAX_KEY_LENGTH} characters without '/')"
        )
    return os.path.join(SHM_DIRECTORY, bare)


def _map(name: str, key: str, path: str, offset: int, byte_size: int) -> _Region:
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise InvalidArgumentError(
            f"Unable to open shared memory region '{name}': no shared memory segment '{key}'"
        ) from None
    except OSError as exc:
        raise InvalidArgumentError(
            f"Unable to open shared memory region '{name}' (key '{key}'): {exc.strerror}"
        ) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InvalidArgumentError(
                f"shared memory region '{name}': key '{key}' is not a shared memory segment"
            )
        if offset + byte_size > info.st_size:
            # Mapping past the segment's end would crash the server on access (SIGBUS).
            raise InvalidArgumentError(
                f"failed to register shared memory region '{name}': invalid args: offset {offset} + "
                f"byte_size {byte_size} is past the end of segment '{key}' ({info.st_size} bytes)"
            )
        start = offset % mmap.ALLOCATIONGRANULARITY
        try:
            mapping = mmap.mmap(fd, start + byte_size, offset=offset - start)
        except OSError as exc:
            raise InvalidArgumentError(
                f"Unable to map shared memory region '{name}' (key '{key}'): {exc.strerror}"
            ) from None
    except BaseException:
        os.close(fd)
        raise
    return _Region(name, key, offset, byte_size, mapping, start, fd)
