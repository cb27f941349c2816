"""BYTES tensors on the wire: each element is a 4-byte little-endian length, then its bytes."""

from __future__ import annotations

import struct

import numpy as np

from coreserve.errors import InvalidArgumentError

_LENGTH = struct.Struct("<I")


def encode_bytes_tensor(array: np.ndarray) -> bytes:
    """Serializes an object array of bytes (or str, encoded as UTF-8) in row-major order."""
    parts: list[bytes] = []
    pack = _LENGTH.pack
    for item in array.ravel():
        data = item.encode("utf-8") if isinstance(item, str) else bytes(item)
        parts.append(pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def decode_bytes_tensor(buffer: bytes | memoryview, count: int | None, name: str) -> np.ndarray:
    """Parses `count` elements (all there are, when None) into a 1-D object array of bytes.

    Raises InvalidArgumentError when the data ends inside an element or, with a count,
    when bytes are left over.
    """
    view = memoryview(buffer)
    size = len(view)
    items: list[bytes] = []
    offset = 0
    unpack = _LENGTH.unpack_from
    while offset < size if count is None else len(items) < count:
        if offset + 4 > size:
            raise InvalidArgumentError(
                f"BYTES data of tensor '{name}' ends inside the length of element {len(items)}"
            )
        (length,) = unpack(view, offset)
        offset += 4
        if offset + length > size:
            raise InvalidArgumentError(
                f"BYTES data of tensor '{name}' ends inside element {len(items)} "
                f"({length} bytes announced, {size - offset} left)"
            )
        items.append(bytes(view[offset : offset + length]))
        offset += length
    if offset != size:
        raise InvalidArgumentError(
            f"BYTES data of tensor '{name}' has {size - offset} bytes after its {len(items)} elements"
        )
    array = np.empty(len(items), dtype=np.object_)
    array[:] = items
    return array
