"""Turns what a Python caller passes as an input tensor into the numpy array a request carries."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from coreserve.errors import InvalidArgumentError


def input_arrays(inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Each input as a numpy array: arrays as they are, DLPack tensors without a copy, lists converted.

    Text (numpy `str_`/`bytes_` arrays, lists of `str`) becomes a BYTES tensor: an object array
    of UTF-8 `bytes`, as backends receive BYTES. Dtypes are never changed otherwise: a model that
    wants FP32 refuses FP64, as it would over the wire.
    """
    if not isinstance(inputs, Mapping):
        raise InvalidArgumentError(
            f"inputs must be a mapping of input name to tensor, not {type(inputs).__name__}"
        )
    arrays = {}
    for name, value in inputs.items():
        if not isinstance(name, str):
            raise InvalidArgumentError(f"input names must be strings, not {type(name).__name__}")
        arrays[name] = _array(name, value)
    return arrays


def _array(name: str, value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        array = value
    elif hasattr(value, "__dlpack__"):  # torch, jax, cupy (host memory) …: shares the memory
        try:
            array = np.from_dlpack(value)
        except (BufferError, RuntimeError, TypeError) as exc:
            raise InvalidArgumentError(f"input '{name}' cannot be read through DLPack: {exc}") from None
    else:
        try:
            array = np.asarray(value)
        except (ValueError, TypeError) as exc:
            raise InvalidArgumentError(f"input '{name}' is not a tensor: {exc}") from None
    if array.dtype.kind in "US":
        return _bytes_tensor(array)
    if array.dtype.kind == "O":
        if all(isinstance(item, bytes) for item in array.flat):
            return array
        if not all(isinstance(item, (bytes, str)) for item in array.flat):
            raise InvalidArgumentError(f"input '{name}' holds Python objects that are not bytes or str")
        return _bytes_tensor(array)
    return array


def _bytes_tensor(array: np.ndarray) -> np.ndarray:
    """An object array of `bytes` of the same shape (BYTES), text encoded as UTF-8."""
    encoded = np.empty(array.shape, dtype=np.object_)
    for index, item in np.ndenumerate(array):
        encoded[index] = item.encode() if isinstance(item, str) else bytes(item)
    return encoded
