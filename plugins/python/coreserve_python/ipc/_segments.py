"""Tensors between the server and a stub: shared memory segments, or inline when small.

Large tensor data never goes through the socket: the writer copies the tensors of a message
into a shared memory segment (a file in /dev/shm, mapped by both processes) and the message
says where each tensor lies (a `TensorRef`). Segments are pooled and reused; the reader sends
their names back in a `release` message when it no longer needs them. Tensors that take
INLINE_LIMIT bytes or less in all travel in the message itself, as one bytearray laid out as a
segment would be: for them a segment costs more (a copy in, a copy out, and a `release` message
that wakes the writer's reader thread) than the bytes on the socket. Standard library and numpy
only.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
import re
import struct
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np

from coreserve_python.ipc._messages import Blob, TensorRef

# Each element of a BYTES tensor: its length (4 bytes, little-endian), then its bytes.
_ELEMENT_LENGTH = struct.Struct("<I")
ALIGNMENT = 64
SMALLEST_SEGMENT = 64 * 1024
# The tensors of a message up to this size in all travel inline (see above).
INLINE_LIMIT = 64 * 1024
SHM_DIR = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
# A pool's segments are named after its owner (an instance's name, made of the model's name and
# its configuration's group name), kept to this many characters that are safe in a file name:
# a model's name may be as long as any and hold any character, a file name may not.
SEGMENT_OWNER_CHARS = 64
STUB_OWNER = "stub"  # the owner of a stub's segments (the server's are named after instances)
_UNSAFE_IN_FILE_NAMES = re.compile(r"[^A-Za-z0-9_.-]")

DTYPES: dict[str, Any] = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BYTES": np.object_,
}
try:  # BF16 needs ml_dtypes, which a custom stub environment may lack
    import ml_dtypes

    DTYPES["BF16"] = ml_dtypes.bfloat16
except ImportError:  # pragma: no cover - depends on the environment
    pass


def segment_to_release(blob: Blob) -> str | None:
    """The segment a reader must release once done with a message's tensors (None if inline)."""
    return blob if isinstance(blob, str) else None


# Triton's datatype of each numpy dtype but BYTES' (any of kinds O, S and U).
_DATATYPE_OF = {np.dtype(dtype): name for name, dtype in DTYPES.items() if name != "BYTES"}
_NUMPY_DTYPE = {name: dtype for dtype, name in _DATATYPE_OF.items()}  # BYTES' is not here


def datatype_of(array: np.ndarray) -> str:
    found = _DATATYPE_OF.get(array.dtype)
    if found is not None:
        return found
    if array.dtype.kind in "OSU":
        return "BYTES"
    raise TypeError(f"numpy dtype {array.dtype} has no Triton datatype")


class Segment:
    """A shared memory file mapped into this process."""

    def __init__(self, path: Path, size: int, create: bool) -> None:
        self.name = path.name
        self.path = path
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            self.size = os.fstat(fd).st_size
            self.map = mmap.mmap(fd, self.size)
        except BaseException:
            if create:  # (not mapped, out of memory or descriptors: nobody would remove the file)
                path.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)

    def close(self, unlink: bool = False) -> None:
        with contextlib.suppress(BufferError):  # numpy views still use it; it goes when they do
            self.map.close()
        if unlink:
            self.path.unlink(missing_ok=True)


def segment_prefix(owner: str, pid: int) -> str:
    """What the names of the segments `owner` writes in process `pid` begin with (then "-<n>")."""
    return f"coreserve-{_UNSAFE_IN_FILE_NAMES.sub('_', owner[:SEGMENT_OWNER_CHARS])}-{pid}"


class SegmentPool:
    """The segments one side writes into: reused once the other side releases them."""

    _counter = itertools.count()

    def __init__(self, owner: str, inline_limit: int = INLINE_LIMIT) -> None:
        """`inline_limit`: the tensors of a message up to this size in all travel inline."""
        # Segments stay unique when two owners' names shorten alike: the counter is per process.
        self._prefix = segment_prefix(owner, os.getpid())
        self._inline_limit = inline_limit
        self._free: list[Segment] = []
        self._all: dict[str, Segment] = {}
        self._lock = threading.Lock()

    def write(self, arrays: list[tuple[str, np.ndarray]]) -> tuple[Blob, list[TensorRef]]:
        """Copies named arrays into one segment, or inline when small; returns it and the refs."""
        refs: list[TensorRef] = []
        datas: list[Any] = []  # bytes (BYTES tensors) or arrays, in any memory order
        total = 0
        for name, array in arrays:
            datatype = datatype_of(array)
            data: Any = serialize_bytes(array) if datatype == "BYTES" else array
            size = len(data) if datatype == "BYTES" else data.nbytes
            refs.append((name, datatype, array.shape, total, size))
            datas.append(data)
            total += -(-size // ALIGNMENT) * ALIGNMENT
        if total == 0:
            return None, refs
        if total <= self._inline_limit:  # small: bytes copies cost less than numpy's views
            if len(datas) == 1:
                data = datas[0]
                return bytearray(data if isinstance(data, bytes) else data.tobytes()), refs
            inline = bytearray(total)
            for (_, _, _, offset, size), data in zip(refs, datas, strict=True):
                inline[offset : offset + size] = data if isinstance(data, bytes) else data.tobytes()
            return inline, refs
        segment = self._allocate(total)
        _fill(segment.map, refs, datas)
        return segment.name, refs

    def _allocate(self, size: int) -> Segment:
        with self._lock:
            fitting = [segment for segment in self._free if segment.size >= size]
            if fitting:
                segment = min(fitting, key=lambda s: s.size)
                self._free.remove(segment)
                return segment
            capacity = max(SMALLEST_SEGMENT, 1 << (size - 1).bit_length())
            path = SHM_DIR / f"{self._prefix}-{next(self._counter)}"
            segment = Segment(path, capacity, create=True)
            self._all[segment.name] = segment
            return segment

    def free_bytes(self) -> int:
        """What its segments hold for the next tensors: those the other side has released."""
        with self._lock:
            return sum(segment.size for segment in self._free)

    def release(self, name: str) -> None:
        with self._lock:
            segment = self._all.get(name)
            if segment is not None and segment not in self._free:
                self._free.append(segment)

    def close(self) -> None:
        with self._lock:
            for segment in self._all.values():
                segment.close(unlink=True)
            self._all.clear()
            self._free.clear()


def _fill(buffer: Any, refs: list[TensorRef], datas: list[Any]) -> None:
    """Copies each tensor's data (bytes, or an array) to the offset its ref gives in `buffer`."""
    for (_, _, _, offset, size), data in zip(refs, datas, strict=True):
        if isinstance(data, bytes):
            buffer[offset : offset + size] = data
        else:
            target = np.frombuffer(buffer, dtype=data.dtype, count=data.size, offset=offset)
            target.reshape(data.shape)[...] = data  # (in C order, from any memory order)


def write_groups(
    pool: SegmentPool, groups: list[list[tuple[str, np.ndarray]]]
) -> tuple[Blob, list[list[TensorRef]]]:
    """Writes the tensors of several requests or responses into one segment; the refs of each.

    Each group's tensor names are unique within it, not across groups: the refs come back per
    group, in the order given.
    """
    segment, refs = pool.write([named for group in groups for named in group])
    grouped = []
    start = 0
    for group in groups:
        grouped.append(refs[start : start + len(group)])
        start += len(group)
    return segment, grouped


class SegmentReader:
    """The other side's segments, mapped on first use."""

    def __init__(self) -> None:
        self._mapped: dict[str, Segment] = {}

    def arrays(self, name: Blob, refs: list[TensorRef], copy: bool) -> dict[str, np.ndarray]:
        """The arrays a message describes: views into its segment (copies when `copy`) or its
        inline bytes (views always: the message's bytearray belongs to nobody else)."""
        if name is None:
            return {ref[0]: _empty(ref[1], ref[2]) for ref in refs}
        if isinstance(name, bytearray):
            return _views(name, refs, copy=False)
        segment = self._mapped.get(name)
        if segment is None:
            segment = self._mapped[name] = Segment(SHM_DIR / name, 0, create=False)
        return _views(segment.map, refs, copy)

    def forget(self, prefix: str) -> None:
        """Unmaps the segments whose names begin with `prefix` (a `segment_prefix`): those of a
        stub that died, whose files are gone, and whose pid a later stub may come to have."""
        for name in [name for name in self._mapped if name.startswith(prefix + "-")]:
            self._mapped.pop(name).close()

    def close(self) -> None:
        for segment in self._mapped.values():
            segment.close()
        self._mapped.clear()


def _views(buffer: Any, refs: list[TensorRef], copy: bool) -> dict[str, np.ndarray]:
    """The arrays `refs` place in `buffer` (a mapped segment or an inline bytearray)."""
    result = {}
    for tensor_name, datatype, shape, offset, size in refs:
        if datatype == "BYTES":
            result[tensor_name] = deserialize_bytes(memoryview(buffer)[offset : offset + size]).reshape(shape)
            continue
        # (the refs come from the other side's write: `size` is the shape's, in bytes)
        view = np.ndarray(shape, _NUMPY_DTYPE[datatype], buffer, offset)
        result[tensor_name] = view.copy() if copy else view
    return result


def _empty(datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    return np.empty(shape, dtype=DTYPES[datatype])


def serialize_bytes(array: np.ndarray) -> bytes:
    """BYTES elements as 4-byte little-endian lengths followed by the bytes; an element that is
    not bytes is its str() in UTF-8, as Triton's pb_utils writes it (the int 1 is b"1")."""
    parts = []
    for item in array.reshape(-1):
        data = bytes(item) if isinstance(item, bytes) else str(item).encode("utf-8")
        parts.append(_ELEMENT_LENGTH.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def deserialize_bytes(buffer: bytes | memoryview) -> np.ndarray:
    view = memoryview(buffer)
    items = []
    offset = 0
    while offset < len(view):
        (length,) = _ELEMENT_LENGTH.unpack_from(view, offset)
        offset += 4
        items.append(bytes(view[offset : offset + length]))
        offset += length
    array = np.empty(len(items), dtype=np.object_)
    array[:] = items
    return array
