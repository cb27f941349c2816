"""BYTES tensors on the wire: each element is a 4-byte little-endian length, then its bytes."""

from __future__ import annotations

import struct

import numpy as np

from coreserve.errors import RequestMismatchError

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


def decode_bytes_tensor(
    buffer: bytes | memoryview, count: int | None, name: str, model: str = ""
) -> np.ndarray:
    """Parses `count` elements (all there are, when None) into a 1-D object array of bytes.

    Raises RequestMismatchError when the data ends inside an element or, with a count, when
    it holds fewer elements or more bytes: in Triton's words (ValidateBytesInputs), where
    Triton has them; `model` names the model in them when it is known.
    """
    view = memoryview(buffer)
    size = len(view)
    items: list[bytes] = []
    offset = 0
    unpack = _LENGTH.unpack_from
    where = f"inference input '{name}'" + (f" for model '{model}'" if model else "")
    while offset < size if count is None else len(items) < count:
        if offset == size:  # (count is not None)
            raise RequestMismatchError(f"expected {count} string elements for {where}, got {len(items)}")
        if offset + 4 > size:
            raise RequestMismatchError(_incomplete_length(where, size - offset))
        (length,) = unpack(view, offset)
        offset += 4
        if offset + length > size:
            if count is not None and len(items) + 1 < count:  # (Triton counts the element cut short)
                raise RequestMismatchError(
                    f"expected {count} string elements for {where}, got {len(items) + 1}"
                )
            raise RequestMismatchError(
                f"BYTES data of tensor '{name}' ends inside element {len(items)} "
                f"({length} bytes announced, {size - offset} left)"
            )
        items.append(bytes(view[offset : offset + length]))
        offset += length
    if size - offset >= 4:
        raise RequestMismatchError(
            f"unexpected number of string elements {len(items) + 1} for {where}, expecting {len(items)}"
        )
    if offset != size:
        raise RequestMismatchError(_incomplete_length(where, size - offset))
    array = np.empty(len(items), dtype=np.object_)
    array[:] = items
    return array


def _incomplete_length(where: str, left: int) -> str:
    return (
        f"incomplete string length indicator for {where}, expecting 4 bytes but only {left} bytes "
        "available. Please make sure the string length indicator is in one buffer."
    )
