"""Ragged batching, as Triton's: requests whose inputs differ in shape run as one flat batch.

An input with `allow_ragged_batch: true` reaches the model as one 1-D tensor, every request's
elements one after the other (no padding). `batch_input` entries add tensors that tell the
model where each request's part lies; a `batch_output` of kind BATCH_SCATTER_WITH_INPUT_SHAPE
is cut back into each request's part, shaped like that request's source input. Other outputs
are split by rows, one per batch item, as for any batch. `run_batched` uses this for models
whose configuration asks for it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from coreserve.config.signature import ModelSignature
from coreserve.errors import InternalError
from coreserve.protos.model_config_pb2 import BatchInput
from coreserve.types import DataType, InferenceRequest

Arrays = dict[str, np.ndarray]


def is_ragged(signature: ModelSignature) -> bool:
    """True when the configuration asks for ragged inputs, batch inputs or batch outputs."""
    return bool(signature.ragged_inputs or signature.batch_inputs or signature.batch_outputs)


def merge_ragged(requests: Sequence[InferenceRequest], signature: ModelSignature) -> Arrays:
    """The model's inputs for a batch: ragged inputs flat, the others stacked, plus the batch inputs."""
    merged: Arrays = {}
    for name in requests[0].inputs:
        arrays = [request.inputs[name] for request in requests]
        if name in signature.ragged_inputs:
            merged[name] = np.concatenate([array.reshape(-1) for array in arrays])
        else:
            merged[name] = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
    for batch_input in signature.batch_inputs:
        source = batch_input.source_input[0]
        value = batch_input_value(batch_input, [request.inputs[source] for request in requests])
        for target in batch_input.target_name:
            merged[target] = value
    return merged


def batch_input_value(batch_input: BatchInput, sources: Sequence[np.ndarray]) -> np.ndarray:
    """The tensor one `batch_input` gives the model for a batch whose source inputs are `sources`.

    Element counts include the batch dimension (a [2, 3] input counts 6), as Triton's do.
    """
    dtype = DataType.from_config_value(batch_input.data_type).numpy_dtype
    counts = np.array([source.size for source in sources], dtype=np.int64)
    kind = batch_input.kind
    if kind == BatchInput.BATCH_ELEMENT_COUNT:
        return counts.astype(dtype)
    if kind == BatchInput.BATCH_ACCUMULATED_ELEMENT_COUNT:
        return np.cumsum(counts).astype(dtype)
    if kind == BatchInput.BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO:
        return np.concatenate([[0], np.cumsum(counts)]).astype(dtype)
    if kind == BatchInput.BATCH_MAX_ELEMENT_COUNT_AS_SHAPE:
        return np.zeros(int(counts.max()), dtype)  # only its shape says something
    # BATCH_ITEM_SHAPE(_FLATTEN): each batch item's shape without the batch dimension.
    rank = sources[0].ndim - 1
    shapes = [source.shape[1:] for source in sources for _ in range(source.shape[0])]
    items = np.array(shapes, dtype=dtype).reshape(len(shapes), rank)
    return items if kind == BatchInput.BATCH_ITEM_SHAPE else items.reshape(-1)


def split_ragged(
    outputs: Arrays, requests: Sequence[InferenceRequest], signature: ModelSignature
) -> list[Arrays]:
    """Each request's outputs: its part of every batch output, its rows of the others.

    Raises InternalError when the model's outputs do not hold as many elements or rows as the
    batch needs.
    """
    scattered = {
        target: batch_output.source_input[0]
        for batch_output in signature.batch_outputs
        for target in batch_output.target_name
    }
    parts: list[Arrays] = [{} for _ in requests]
    for name, array in outputs.items():
        source = scattered.get(name)
        if source is None:
            sizes = [request.batch_size for request in requests]
            pieces = _cut(name, array, sizes, signature, by_rows=True)
        else:
            shapes = [_scattered_shape(signature, name, request.inputs[source].shape) for request in requests]
            flat = array.reshape(-1)
            pieces = [
                piece.reshape(shape)
                for piece, shape in zip(
                    _cut(name, flat, [int(np.prod(shape)) for shape in shapes], signature, by_rows=False),
                    shapes,
                    strict=True,
                )
            ]
        for part, piece in zip(parts, pieces, strict=True):
            part[name] = piece
    return parts


def _scattered_shape(signature: ModelSignature, name: str, source_shape: tuple[int, ...]) -> tuple[int, ...]:
    """A request's shape of a scattered output: its configured dims, the open ones taken from
    the same dimension of the request's source input (Triton's naive mapping)."""
    dims = signature.outputs[name].dims
    shape = [-1, *dims] if signature.batching else list(dims)
    return tuple(
        source_shape[index] if size == -1 and index < len(source_shape) else size
        for index, size in enumerate(shape)
    )


def _cut(
    name: str, array: np.ndarray, sizes: Sequence[int], signature: ModelSignature, *, by_rows: bool
) -> list[np.ndarray]:
    total = sum(sizes)
    have = array.shape[0] if array.ndim else 0
    if have != total:
        unit = "rows" if by_rows else "elements"
        raise InternalError(
            f"model '{signature.model_name}' returned output '{name}' with shape {list(array.shape)}; "
            f"the batch needs {total} {unit}"
        )
    bounds = np.cumsum([0, *sizes])
    return [array[start:stop] for start, stop in itertools.pairwise(bounds)]
