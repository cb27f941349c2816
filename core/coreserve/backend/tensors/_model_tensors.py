"""A framework model's own inputs and outputs, and what backends do with them: complete a
configuration from them, and check a configuration against them.

Each framework plugin reads its model's tensors into `ModelTensor`s; the logic that follows
is the same for all of them and lives here once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from coreserve.backend.api import ServerContext
from coreserve.config.signature import ModelSignature, TensorSpec
from coreserve.errors import ModelConfigError, UnsupportedError
from coreserve.protos.model_config_pb2 import ModelConfig
from coreserve.types import DataType

DEFAULT_MAX_BATCH_SIZE = 4


@dataclass(frozen=True)
class ModelTensor:
    """An input or output as the model file declares it; dims are -1 where left open."""

    name: str
    datatype: DataType | None  # None: a type coreserve cannot serve
    dims: tuple[int, ...]
    type_name: str = ""  # the framework's own name of the type, for messages


def default_max_batch_size(server: ServerContext, model_name: str) -> int:
    """`--backend-config <backend>,default-max-batch-size=N` (default 4), as Triton reads it."""
    value = server.backend_config.get("default-max-batch-size", str(DEFAULT_MAX_BATCH_SIZE))
    try:
        return max(0, int(value))
    except ValueError:
        raise ModelConfigError(
            f"model '{model_name}': backend setting default-max-batch-size must be an integer, got '{value}'"
        ) from None


def complete_config(
    config: ModelConfig,
    inputs: Sequence[ModelTensor],
    outputs: Sequence[ModelTensor],
    *,
    model_name: str,
    max_batch_size: int,
) -> ModelConfig:
    """Fills inputs, outputs and max_batch_size from the model's tensors, as Triton does.

    A model whose every tensor has an open first dimension gets `max_batch_size` and the
    dynamic batcher, unless the configuration lists its inputs or outputs itself.
    """
    if config.input and config.output:
        return config
    tensors = [*inputs, *outputs]
    batchable = bool(tensors) and all(t.dims and t.dims[0] == -1 for t in tensors)
    if not config.input and not config.output and config.max_batch_size == 0 and batchable:
        config.max_batch_size = max_batch_size
        if config.max_batch_size > 0 and config.WhichOneof("scheduling_choice") is None:
            config.dynamic_batching.SetInParent()
    skip = 1 if config.max_batch_size > 0 else 0
    for target, tensors_of_kind in ((config.input, inputs), (config.output, outputs)):
        if target:
            continue
        for tensor in tensors_of_kind:
            if tensor.datatype is None:
                raise ModelConfigError(
                    f"model '{model_name}': tensor '{tensor.name}' has type {tensor.type_name}, "
                    "which coreserve cannot serve"
                )
            target.add(name=tensor.name, data_type=tensor.datatype.config_value, dims=tensor.dims[skip:])
    return config


def check_model_tensors(
    signature: ModelSignature,
    inputs: Mapping[str, ModelTensor],
    outputs: Mapping[str, ModelTensor],
    framework: str,
    unsupported: frozenset[DataType] = frozenset(),
) -> None:
    """Raises ModelConfigError naming the tensor when the configuration and the model disagree.

    `framework` names the model in messages ("the ONNX model"); datatypes in `unsupported`
    are refused with UnsupportedError.
    """
    model = signature.model_name
    for kind, specs, tensors in (
        ("input", signature.model_inputs, inputs),
        ("output", signature.model_outputs, outputs),
    ):
        for spec in specs.values():
            tensor = tensors.get(spec.name)
            if tensor is None:
                raise ModelConfigError(
                    f"model '{model}': configuration {kind} '{spec.name}' is not an {kind} of {framework} "
                    f"(its {kind}s: {sorted(tensors)})"
                )
            _check_tensor(signature, kind, spec, tensor, framework, unsupported)
    missing = [name for name in inputs if name not in signature.model_inputs]
    if missing:
        raise ModelConfigError(
            f"model '{model}': {framework} needs input(s) {missing} that the configuration does not list"
        )


def _check_tensor(
    signature: ModelSignature,
    kind: str,
    spec: TensorSpec,
    tensor: ModelTensor,
    framework: str,
    unsupported: frozenset[DataType],
) -> None:
    where = f"model '{signature.model_name}', {kind} '{spec.name}'"
    if tensor.datatype is None:
        raise ModelConfigError(f"{where}: the type {tensor.type_name} of {framework} cannot be served")
    if tensor.datatype in unsupported:
        raise UnsupportedError(f"{where}: {framework} cannot exchange {tensor.datatype} tensors here")
    if tensor.datatype is not spec.datatype:
        raise ModelConfigError(
            f"{where}: the configuration says {spec.datatype}, {framework} has {tensor.datatype}"
        )
    dims = list(spec.reshape if spec.reshape is not None else spec.dims)
    expected = [-1, *dims] if signature.batching else dims
    actual = list(tensor.dims)
    if any(spec.name in batch_input.target_name for batch_input in signature.batch_inputs):
        return  # a batch_input: its shape follows the batch (e.g. [requests], [items, rank])
    scattered = any(spec.name in batch_output.target_name for batch_output in signature.batch_outputs)
    if scattered or spec.name in signature.ragged_inputs:
        expected = [-1]  # the whole batch, flat (Triton's ragged layout)
    if signature.batching and (not actual or actual[0] != -1):
        raise ModelConfigError(
            f"{where}: max_batch_size is {signature.max_batch_size}, so {framework}'s first dimension "
            f"must be dynamic, but its shape is {actual}"
        )
    if len(actual) != len(expected) or any(
        model_dim not in (-1, config_dim) for model_dim, config_dim in zip(actual, expected, strict=True)
    ):
        raise ModelConfigError(
            f"{where}: the configuration's shape {expected} does not fit {framework}'s shape {actual}"
        )
