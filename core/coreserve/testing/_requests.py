"""Requests that fit a model's configuration, with deterministic data, for the conformance rules."""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import ml_dtypes
import numpy as np

from coreserve.backend import ModelSignature, TensorSpec
from coreserve.types import DataType, InferenceRequest

# The size an open dimension (-1) gets in a sample request.
OPEN_DIM = 2
_sequence_ids = itertools.count(1)


def sample_array(spec: TensorSpec, batch: int | None, seed: int) -> np.ndarray:
    """An array of `spec`'s datatype and dims (open ones `OPEN_DIM`), `batch` rows first if given.

    Integers stay small (0..3) and floats in [0, 1), so that models that index or divide by
    them still run.
    """
    dims = tuple(OPEN_DIM if dim == -1 else dim for dim in spec.dims)
    shape = dims if batch is None else (batch, *dims)
    rng = np.random.default_rng(seed)
    datatype = spec.datatype
    if datatype is DataType.BYTES:
        count = int(np.prod(shape, dtype=np.int64))
        return np.array([f"s{seed}-{n}".encode() for n in range(count)], dtype=object).reshape(shape)
    if datatype is DataType.BOOL:
        return rng.integers(0, 2, size=shape).astype(bool)
    if datatype is DataType.BF16:
        return rng.random(size=shape, dtype=np.float32).astype(ml_dtypes.bfloat16)
    dtype = datatype.numpy_dtype
    if np.issubdtype(dtype, np.floating):
        return rng.random(size=shape).astype(dtype)
    return rng.integers(0, 4, size=shape).astype(dtype)


def sample_inputs(signature: ModelSignature, batch: int, seed: int) -> dict[str, np.ndarray]:
    """Every input of the model (optional ones too), `batch` rows each for a model that batches."""
    rows = batch if signature.batching else None
    return {
        name: sample_array(spec, rows, seed * 101 + index)
        for index, (name, spec) in enumerate(signature.inputs.items())
    }


def make_request(
    signature: ModelSignature,
    inputs: Mapping[str, np.ndarray],
    *,
    requested_outputs: tuple[str, ...] | None = None,
    sequence: bool = False,
    request_id: str = "",
) -> InferenceRequest:
    """A request for the model; for a sequence model, a whole sequence of its own (start and end)."""
    parameters: dict[str, bool | int | float | str] = {}
    if sequence:
        parameters = {"sequence_id": next(_sequence_ids), "sequence_start": True, "sequence_end": True}
    return InferenceRequest(
        model_name=signature.model_name,
        inputs=dict(inputs),
        id=request_id,
        parameters=parameters,
        requested_outputs=requested_outputs,
    )


def rows_of(inputs: Mapping[str, np.ndarray], start: int, stop: int) -> dict[str, np.ndarray]:
    """The rows start..stop of every input (a batch split into requests)."""
    return {name: array[start:stop] for name, array in inputs.items()}
