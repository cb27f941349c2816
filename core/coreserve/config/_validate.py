"""Checks a model configuration before anything is loaded from it.

Each error names the model and the field (`input[1].dims`) and says what is wrong, so that an
operator can fix `config.pbtxt` from the message alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from coreserve.config._batch_io import check_batch_io
from coreserve.errors import ModelConfigError
from coreserve.protos.model_config_pb2 import (
    DataType,
    ModelConfig,
    ModelInstanceGroup,
    ModelSequenceBatching,
)

# proto3 enums are open: text format and JSON accept any number, e.g. `data_type: 99`.
_DATA_TYPES = frozenset(DataType.values()) - {DataType.TYPE_INVALID}


def validate_config(config: ModelConfig) -> None:
    """Raises ModelConfigError for the first problem found."""
    problem = _first_problem(config)
    if problem is not None:
        raise ModelConfigError(f"model '{config.name}': {problem}")


def _first_problem(config: ModelConfig) -> str | None:
    checks: Iterable[str | None] = (
        "config field 'name' is empty" if not config.name else None,
        _check_max_batch_size(config),
        _check_tensors("input", config.input, config.max_batch_size, config.name),
        _check_tensors("output", config.output, config.max_batch_size, config.name),
        _check_version_policy(config),
        _check_instance_groups(config),
        _check_dynamic_batching(config),
        _check_sequence_batching(config),
        _check_ensemble(config),
        _check_response_cache(config),
        check_batch_io(config),
    )
    return next((problem for problem in checks if problem is not None), None)


def _check_max_batch_size(config: ModelConfig) -> str | None:
    if config.max_batch_size < 0:
        return f"config field 'max_batch_size' must be >= 0, got {config.max_batch_size}"
    return None


def _check_tensors(kind: str, tensors: Iterable[Any], max_batch_size: int, model: str) -> str | None:
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
        if tensor.data_type not in _DATA_TYPES:
            return f"{where}: data_type {tensor.data_type} is not a known type"
        bad = [dim for dim in tensor.dims if dim < -1 or dim == 0]
        if bad:
            return f"{where}: every entry of dims must be -1 (any size) or >= 1, got {list(tensor.dims)}"
        if not tensor.dims and not tensor.HasField("reshape"):
            return (
                f"{where} needs dims (one value is dims [ 1 ], with reshape {{ shape: [ ] }} on a model "
                "that batches)"
            )
        if tensor.HasField("reshape") and not tensor.reshape.shape and not max_batch_size:  # Triton's words:
            return (
                f"{where}: cannot have empty reshape for non-batching model as scalar tensors "
                "are not supported"
            )
        if tensor.HasField("reshape"):
            problem = _reshape_problem(list(tensor.dims), list(tensor.reshape.shape))
            if problem:  # Triton's words, then the shapes
                return (
                    f"model {kind} '{tensor.name}' {problem} for {model} (dims {list(tensor.dims)}, "
                    f"reshape {list(tensor.reshape.shape)})"
                )
    return None


def _reshape_problem(dims: list[int], shape: list[int]) -> str | None:
    """As Triton checks a reshape: the same element count, or (with -1 entries) the same count
    in each stretch between them; an empty reshape stands for dims holding one element."""
    if not shape:
        return None if -1 not in dims and _product(dims) == 1 else "has different size for dims and reshape"
    dims_stretches, shape_stretches = _stretches(dims), _stretches(shape)
    if len(dims_stretches) != len(shape_stretches):
        if len(dims_stretches) == 1 or len(shape_stretches) == 1:  # one side fixed, the other not
            return "has different size for dims and reshape"
        return "has different number of variable-size dimensions for dims and reshape"
    if dims_stretches != shape_stretches:
        return "has different size for dims and reshape"
    return None


def _stretches(dims: list[int]) -> list[int]:
    """The element counts of the stretches of `dims` between its -1 entries."""
    counts = [1]
    for dim in dims:
        if dim == -1:
            counts.append(1)
        else:
            counts[-1] *= dim
    return counts


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
        if any(v < 0 for v in policy.specific.versions):  # a folder `0` is a version, as in Triton
            return (
                "config field 'version_policy.specific.versions' must hold versions >= 0, "
                f"got {list(policy.specific.versions)}"
            )
    return None


def _check_instance_groups(config: ModelConfig) -> str | None:
    for index, group in enumerate(config.instance_group):
        where = f"config field 'instance_group[{index}]'"
        if group.kind not in ModelInstanceGroup.Kind.values():
            kinds = ", ".join(ModelInstanceGroup.Kind.keys())
            return f"{where}: kind {group.kind} is not a kind of instance group ({kinds})"
        if any(gpu < 0 for gpu in group.gpus):
            return f"{where}: gpus must be device ids >= 0, got {list(group.gpus)}"
        if group.gpus and group.kind == ModelInstanceGroup.KIND_CPU:
            return f"{where}: gpus are listed for a KIND_CPU group"
    return None


def _check_dynamic_batching(config: ModelConfig) -> str | None:
    if not config.HasField("dynamic_batching"):
        return None
    batching = config.dynamic_batching  # (on a model that cannot batch, as Triton: batches of one)
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
    for level in batching.priority_queue_policy if levels else ():  # (without levels: not read)
        if not 1 <= level <= levels:
            return (
                f"config field 'dynamic_batching.priority_queue_policy' has level {level}, "
                f"outside 1..priority_levels ({levels})"
            )
    if batching.preserve_ordering:  # responses in order cannot also jump the queue: Triton's words
        if levels > 1:
            return "Only one priority level is allowed when 'preserve_ordering' is true"
        policies = [batching.default_queue_policy, *batching.priority_queue_policy.values()]
        if any(p.default_timeout_microseconds and p.timeout_action == p.DELAY for p in policies):
            return "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true"
    return None


def _check_sequence_batching(config: ModelConfig) -> str | None:
    if not config.HasField("sequence_batching"):
        return None
    batching = config.sequence_batching
    utilization = batching.direct.minimum_slot_utilization
    if not 0.0 <= utilization <= 1.0:
        return (
            "config field 'sequence_batching.direct.minimum_slot_utilization' must lie in 0..1, "
            f"got {utilization:g}"
        )
    slots = max(1, config.max_batch_size)
    for size in batching.oldest.preferred_batch_size:
        if not 1 <= size <= slots:
            return (
                f"config field 'sequence_batching.oldest.preferred_batch_size' has {size}, "
                f"outside 1..max_batch_size ({slots})"
            )
    taken = {tensor.name for tensor in config.input}
    kinds: set[int] = set()
    for index, control_input in enumerate(batching.control_input):
        where = f"config field 'sequence_batching.control_input[{index}]'"
        if not control_input.name or control_input.name in taken:
            return f"{where} needs a name that no other input has, got '{control_input.name}'"
        taken.add(control_input.name)
        if len(control_input.control) != 1:
            return f"{where} must hold exactly one control"
        control = control_input.control[0]
        if control.kind in kinds:  # Triton's words
            kind = ModelSequenceBatching.Control.Kind.Name(control.kind)
            return f"sequence batching specifies multiple {kind} tensors for {config.name}"
        kinds.add(control.kind)
        if control.kind == ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID:
            if control.data_type == DataType.TYPE_INVALID:
                return f"{where}: a CORRID control needs data_type"
            if control.data_type not in _DATA_TYPES:
                return f"{where}: data_type {control.data_type} is not a known type"
            continue
        pairs = [p for p in (control.int32_false_true, control.fp32_false_true, control.bool_false_true) if p]
        if len(pairs) != 1 or len(pairs[0]) != 2:
            return (
                f"{where} needs exactly one of int32_false_true, fp32_false_true, bool_false_true "
                "with two values"
            )
    for index, state in enumerate(batching.state):
        where = f"config field 'sequence_batching.state[{index}]'"
        if not state.input_name or not state.output_name:
            return f"{where} needs input_name and output_name"
        if state.input_name in taken:
            return f"{where}: input_name '{state.input_name}' is already the name of an input"
        taken.add(state.input_name)
        if state.data_type == DataType.TYPE_INVALID:
            return f"{where} needs a data_type"
        if state.data_type not in _DATA_TYPES:
            return f"{where}: data_type {state.data_type} is not a known type"
        initial = state.initial_state[0] if state.initial_state else None
        dims = list(initial.dims) if initial is not None and initial.dims else list(state.dims)
        if any(dim < 0 for dim in dims):
            return f"{where}: dims {dims} are not fixed; give initial_state dims"
    return None


def _check_response_cache(config: ModelConfig) -> str | None:
    """Triton refuses a cache where one request may have many answers (in Triton's words)."""
    if not config.response_cache.enable:
        return None
    if config.model_transaction_policy.decoupled:
        return (
            f"Response Cache does not currently support model {config.name} with 'decoupled' "
            "transaction policy. Please disable the response cache."
        )
    if config.HasField("sequence_batching"):
        return (
            f"Response Cache does not currently support model {config.name} with sequence batching "
            "scheduler. Please disable the response cache."
        )
    return None


def _check_ensemble(config: ModelConfig) -> str | None:
    if config.HasField("ensemble_scheduling") and config.platform != "ensemble":
        return "config field 'ensemble_scheduling' needs platform: \"ensemble\""
    if config.platform == "ensemble" and not config.HasField("ensemble_scheduling"):
        return "platform \"ensemble\" needs config field 'ensemble_scheduling'"
    if config.HasField("ensemble_scheduling"):  # (Triton's words: an ensemble runs only its steps)
        if config.instance_group:
            return f"instance group should not be specified for ensemble '{config.name}'"
        if config.model_warmup:
            return f"model_warmup can not be specified for ensemble '{config.name}'"
    return None
