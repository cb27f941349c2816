"""Checks of the ragged-batching fields of a configuration: `batch_input` and `batch_output`.

Each names tensors of the model (`source_input`, `target_name`); a name that is not there
would only fail when a batch runs, so it is refused when the model loads.
"""

from __future__ import annotations

from coreserve.protos.model_config_pb2 import BatchInput, BatchOutput, DataType, ModelConfig

# Element counts are given as INT32 or FP32 (Triton's backends write nothing else); item
# shapes may also be INT64.
_COUNT_TYPES = frozenset({DataType.TYPE_INT32, DataType.TYPE_FP32})
_SHAPE_TYPES = _COUNT_TYPES | {DataType.TYPE_INT64}
_SHAPE_KINDS = frozenset({BatchInput.BATCH_ITEM_SHAPE, BatchInput.BATCH_ITEM_SHAPE_FLATTEN})


def check_batch_io(config: ModelConfig) -> str | None:
    """The first problem of the configuration's batch_input and batch_output entries, or None."""
    inputs = [tensor.name for tensor in config.input]
    outputs = [tensor.name for tensor in config.output]
    for index, batch_input in enumerate(config.batch_input):
        where = f"config field 'batch_input[{index}]'"
        if batch_input.kind not in BatchInput.Kind.values():
            return f"{where} has an unknown kind ({batch_input.kind})"
        kind = BatchInput.Kind.Name(batch_input.kind)
        allowed = _SHAPE_TYPES if batch_input.kind in _SHAPE_KINDS else _COUNT_TYPES
        if batch_input.data_type not in allowed:
            names = ", ".join(sorted(DataType.Name(value) for value in allowed))
            return f"{where}: data_type of {kind} must be one of {names}"
        problem = _check_source(where, list(batch_input.source_input), inputs)
        if problem is not None:
            return problem
        if not batch_input.target_name:
            return f"{where} has no target_name (the model input it fills)"
        taken = [name for name in batch_input.target_name if name in inputs]
        if taken:
            return f"{where}: target_name '{taken[0]}' is already an input that clients send"
    for index, batch_output in enumerate(config.batch_output):
        where = f"config field 'batch_output[{index}]'"
        if batch_output.kind not in BatchOutput.Kind.values():
            return f"{where} has an unknown kind ({batch_output.kind})"
        problem = _check_source(where, list(batch_output.source_input), inputs)
        if problem is not None:
            return problem
        if not batch_output.target_name:
            return f"{where} has no target_name (the output it scatters)"
        unknown = [name for name in batch_output.target_name if name not in outputs]
        if unknown:
            return f"{where}: target_name '{unknown[0]}' is not an output of the model (outputs: {outputs})"
        twice = [
            name
            for index, name in enumerate(batch_output.target_name)
            if name in batch_output.target_name[:index]
        ]
        if twice:  # Triton's words
            return f"target output name '{twice[0]}' can only be specified once"
    return None


def _check_source(where: str, sources: list[str], inputs: list[str]) -> str | None:
    if len(sources) != 1:
        return f"{where} must name exactly one source_input, got {len(sources)}"
    if sources[0] not in inputs:
        return f"{where}: source_input '{sources[0]}' is not an input of the model (inputs: {inputs})"
    return None
