"""Every v2 datatype: a sample array of each, and the config of an identity model over it."""

from __future__ import annotations

import ml_dtypes
import numpy as np

NUMPY = {
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
CONFIG_TYPE = {name: "TYPE_STRING" if name == "BYTES" else f"TYPE_{name}" for name in [*NUMPY, "BF16"]}


def datatype_sample(datatype: str) -> np.ndarray:
    """A 2x5 array of `datatype`, the same on every call."""
    rng = np.random.default_rng(3)
    if datatype == "BOOL":
        return rng.integers(0, 2, size=(2, 5)).astype(bool)
    if datatype == "BYTES":
        return np.array(
            [[f"word {i}".encode() for i in range(5)], [b"", b"x", "\u00e9t\u00e9".encode(), b"y", b"z"]],
            dtype=np.object_,
        )
    if datatype == "BF16":
        return rng.normal(size=(2, 5)).astype(ml_dtypes.bfloat16)
    dtype = np.dtype(NUMPY[datatype])
    if dtype.kind == "f":
        return rng.normal(size=(2, 5)).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=(2, 5), dtype=dtype, endpoint=True)


def identity_config(name: str, datatype: str, backend: str) -> str:
    """The config.pbtxt of a batching model `name` whose OUTPUT0 is its INPUT0, of `datatype`."""
    return f"""
name: "{name}"
backend: "{backend}"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: {CONFIG_TYPE[datatype]} dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: {CONFIG_TYPE[datatype]} dims: [ -1 ] }} ]
"""
