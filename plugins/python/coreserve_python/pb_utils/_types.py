"""Type names and numbers of `triton_python_backend_utils`, and Triton's serialized BYTES form.

Each helper answers exactly as Triton 2.51's own module does on the same input, odd corners
included (`TYPE_BOOL` is Python's `bool`, an unknown number or numpy type gives None, an
unknown type name raises KeyError): a model that relies on them must not see a difference.
tests/plugins/python/pb_utils/test_utils_triton.py compares them with Triton's module.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}
# TRITONSERVER_DataType numbers and their numpy types, in the order Triton compares them.
_NUMBERED_TYPES: tuple[tuple[int, Any], ...] = (
    (1, np.bool_),
    (2, np.uint8),
    (3, np.uint16),
    (4, np.uint32),
    (5, np.uint64),
    (6, np.int8),
    (7, np.int16),
    (8, np.int32),
    (9, np.int64),
    (10, np.float16),
    (11, np.float32),
    (12, np.float64),
    (13, np.object_),
)
_LENGTH = struct.Struct("<I")


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """The numpy type of a configuration type name ("TYPE_FP32" -> numpy.float32); KeyError if unknown."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def numpy_to_triton_string(data_type: Any) -> str:
    """The configuration type name of a numpy type (numpy.float32 -> "TYPE_FP32"); coreserve's own."""
    dtype = np.dtype(data_type)
    if dtype.kind in "OSU":
        return "TYPE_STRING"
    for name, numpy_type in TRITON_STRING_TO_NUMPY.items():
        if name != "TYPE_STRING" and np.dtype(numpy_type) == dtype:
            return name
    raise ValueError(f"numpy type {dtype} has no Triton type")


def numpy_to_triton_type(data_type: Any) -> int | None:
    """The TRITONSERVER_DataType number of a numpy type or dtype; None if it has none."""
    for number, numpy_type in _NUMBERED_TYPES:
        if data_type == numpy_type:
            return number
    return 13 if data_type == np.bytes_ else None


def triton_to_numpy_type(data_type: int) -> Any:
    """The numpy type of a TRITONSERVER_DataType number; None if it is not one."""
    return next((numpy_type for number, numpy_type in _NUMBERED_TYPES if data_type == number), None)


def serialize_byte_tensor(input_tensor: np.ndarray) -> Any:
    """A BYTES tensor in Triton's serialized form: each element as a 4-byte little-endian length
    and its bytes, in C order (str and other objects: their UTF-8 text).

    As Triton's: `bytes`; an empty tuple for an empty tensor; None unless the dtype is object or
    bytes.
    """
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype != np.object_ and input_tensor.dtype.type != np.bytes_:
        return None
    parts = []
    for item in input_tensor.reshape(-1, order="C"):
        if input_tensor.dtype == np.object_:
            data = item if type(item) is bytes else str(item).encode("utf-8")
        else:
            data = bytes(item)
        parts.append(_LENGTH.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def deserialize_bytes_tensor(encoded_tensor: Any) -> np.ndarray:
    """The elements of a serialized BYTES tensor, as a 1-D object array of bytes."""
    items = []
    offset = 0
    while offset < len(encoded_tensor):
        (length,) = _LENGTH.unpack_from(encoded_tensor, offset)
        offset += _LENGTH.size
        # struct, not slicing: a truncated element raises struct.error, as in Triton's module
        (item,) = struct.unpack_from(f"<{length}s", encoded_tensor, offset)
        items.append(item)
        offset += length
    return np.array(items, dtype=np.object_)
