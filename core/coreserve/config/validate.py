"""Checks a model configuration before anything is loaded from it.

Each error names the model and the field (`input[1].dims`) and says what is wrong, so that an
operator can fix `config.pbtxt` from the message alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from coreserve.errors import ModelConfigError
from coreserve.protos.model_config_pb2 import (
    DataType,
    ModelConfig,
    ModelInstanceGroup,
)


def validate_config(config: ModelConfig) -> None:
    """Raises ModelConfigError for the first problem found."""
    problem = _first_problem(config)
    if problem is not None:
        raise ModelConfigError(f"model '{config.name}': {problem}")


def _first_problem(config: ModelConfig) -> str | None:
    checks: Iterable[str | None] = (
        "config field 'name' is empty" if not config.name else None,
        _check_max_batch_size(config),
        _check_tensors("input", config.input),
        _check_tensors("output", config.output),
        _check_version_policy(config),
        _check_instance_groups(config),
        _check_dynamic_batching(config),
    )
    return next((problem for problem in checks if problem is not None), None)


def _check_max_batch_size(config: ModelConfig) -> str | None:
    if config.max_batch_size < 0:
        return f"config field 'max_batch_size' must be >= 0, got {config.max_batch_size}"
    return None


def _check_tensors(kind: str, tensors: Iterable[Any]) -> str | None:
    """Checks `input` or `output` entries (ModelInput or ModelOutput messages)."""
    seen: set[str] = set()
    for index, tensor in enumerate(tensors):
        where = f"config field '{kind}[{index}]'"
        if not tensor.name:
            return f"{where} has no name"
        if tensor.name in seen:
            return f"{where}: {kind} name '{tensor.name}' appears more than once"
        seen.add(tensor.name)
        where = f"config field '{kind}[{index}]' ('{tensor.name}')"
        if tensor.data_type == DataType.TYPE_INVALID:
            return f"{where} needs a data_type"
        bad = [dim for dim in tensor.dims if dim < -1 or dim == 0]
        if bad:
            return f"{where}: every entry of dims must be -1 (any size) or >= 1, got {list(tensor.dims)}"
        if not tensor.dims and not tensor.HasField("reshape"):
            return f"{where} needs dims (use reshape {{ shape: [ ] }} for a scalar)"
        if tensor.HasField("reshape"):
            problem = _check_reshape(list(tensor.dims), list(tensor.reshape.shape))
            if problem:
                return f"{where}: {problem}"
    return None


def _check_reshape(dims: list[int], shape: list[int]) -> str | None:
    if -1 in dims or -1 in shape:
        if dims.count(-1) != shape.count(-1):
            return f"reshape {shape} must have as many -1 entries as dims {dims}"
        return None
    dims_count = _product(dims)
    if dims_count != _product(shape):
        return f"reshape {shape} holds {_product(shape)} elements but dims {dims} hold {dims_count}"
    return None


def _product(values: Iterable[int]) -> int:
    result = 1
    for value in values:
        result *= value
    return result


def _check_version_policy(config: ModelConfig) -> str | None:
    policy = config.version_policy
    choice = policy.WhichOneof("policy_choice")
    if choice == "latest" and policy.latest.num_versions < 1:
        return "config field 'version_policy.latest.num_versions' must be >= 1"
    if choice == "specific":
        if not policy.specific.versions:
            return "config field 'version_policy.specific.versions' lists no versions"
        if any(v < 1 for v in policy.specific.versions):
            return (
                "config field 'version_policy.specific.versions' must hold versions >= 1, "
                f"got {list(policy.specific.versions)}"
            )
    return None


def _check_instance_groups(config: ModelConfig) -> str | None:
    for index, group in enumerate(config.instance_group):
        where = f"config field 'instance_group[{index}]'"
        if group.count < 1:
            return f"{where}: count must be >= 1, got {group.count}"
        if any(gpu < 0 for gpu in group.gpus):
            return f"{where}: gpus must be device ids >= 0, got {list(group.gpus)}"
        if group.gpus and group.kind == ModelInstanceGroup.KIND_CPU:
            return f"{where}: gpus are listed for a KIND_CPU group"
    return None


def _check_dynamic_batching(config: ModelConfig) -> str | None:
    if not config.HasField("dynamic_batching"):
        return None
    batching = config.dynamic_batching
    if config.max_batch_size == 0:
        return "config field 'dynamic_batching' needs max_batch_size > 0 (the model cannot batch)"
    for size in batching.preferred_batch_size:
        if not 1 <= size <= config.max_batch_size:
            return (
                f"config field 'dynamic_batching.preferred_batch_size' holds {size}, "
                f"outside 1..max_batch_size ({config.max_batch_size})"
            )
    levels = batching.priority_levels
    if levels and not 1 <= batching.default_priority_level <= levels:
        return (
            "config field 'dynamic_batching.default_priority_level' must be within 1.."
            f"priority_levels ({levels}), got {batching.default_priority_level}"
        )
    for level in batching.priority_queue_policy:
        if not 1 <= level <= levels:
            return (
                f"config field 'dynamic_batching.priority_queue_policy' has level {level}, "
                f"outside 1..priority_levels ({levels})"
            )
    return None
