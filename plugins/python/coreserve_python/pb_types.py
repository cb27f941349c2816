"""Type names and numbers of `triton_python_backend_utils`, and Triton's serialized BYTES form."""

from __future__ import annotations

from typing import Any

import numpy as np

from coreserve_python.pb_errors import TritonModelException

_CONFIG_TYPES: dict[str, Any] = {
    "TYPE_BOOL": np.bool_,
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
# TRITONSERVER_DataType numbers, as Triton's pb_utils returns them.
_TRITON_TYPE_NUMBERS = {
    "TYPE_BOOL": 1,
    "TYPE_UINT8": 2,
    "TYPE_UINT16": 3,
    "TYPE_UINT32": 4,
    "TYPE_UINT64": 5,
    "TYPE_INT8": 6,
    "TYPE_INT16": 7,
    "TYPE_INT32": 8,
    "TYPE_INT64": 9,
    "TYPE_FP16": 10,
    "TYPE_FP32": 11,
    "TYPE_FP64": 12,
    "TYPE_STRING": 13,
}


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """The numpy type of a configuration type name: "TYPE_FP32" -> numpy.float32."""
    try:
        return _CONFIG_TYPES[triton_type_string]
    except KeyError:
        raise TritonModelException(f"unknown Triton type '{triton_type_string}'") from None


def numpy_to_triton_string(data_type: Any) -> str:
    """The configuration type name of a numpy type: numpy.float32 -> "TYPE_FP32"."""
    dtype = np.dtype(data_type)
    if dtype.kind in "OSU":
        return "TYPE_STRING"
    for name, numpy_type in _CONFIG_TYPES.items():
        if name != "TYPE_STRING" and np.dtype(numpy_type) == dtype:
            return name
    raise TritonModelException(f"numpy type {dtype} has no Triton type")


def numpy_to_triton_type(data_type: Any) -> int:
    """The TRITONSERVER_DataType number of a numpy type."""
    return _TRITON_TYPE_NUMBERS[numpy_to_triton_string(data_type)]


def triton_to_numpy_type(data_type: int) -> Any:
    for name, number in _TRITON_TYPE_NUMBERS.items():
        if number == data_type:
            return _CONFIG_TYPES[name]
    raise TritonModelException(f"unknown TRITONSERVER_DataType {data_type}")


def serialize_byte_tensor(input_tensor: np.ndarray) -> np.ndarray:
    """BYTES elements in Triton's serialized form (4-byte lengths), as a uint8 array."""
    parts = []
    for item in np.asarray(input_tensor, dtype=np.object_).reshape(-1):
        data = item.encode("utf-8") if isinstance(item, str) else bytes(item)
        parts.append(len(data).to_bytes(4, "little") + data)
    return np.frombuffer(b"".join(parts), dtype=np.uint8)


def deserialize_bytes_tensor(encoded_tensor: bytes | np.ndarray) -> np.ndarray:
    buffer = encoded_tensor.tobytes() if isinstance(encoded_tensor, np.ndarray) else bytes(encoded_tensor)
    items = []
    offset = 0
    while offset < len(buffer):
        length = int.from_bytes(buffer[offset : offset + 4], "little")
        items.append(buffer[offset + 4 : offset + 4 + length])
        offset += 4 + length
    array = np.empty(len(items), dtype=np.object_)
    array[:] = items
    return array
