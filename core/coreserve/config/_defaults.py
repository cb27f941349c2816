"""Defaults the core fills into every model configuration before validation."""

from __future__ import annotations

from coreserve.config.instance_groups import place_instance_group
from coreserve.errors import ModelConfigError
from coreserve.protos.model_config_pb2 import ModelConfig, ModelInstanceGroup

SEQUENCE_IDLE_DEFAULT_US = 1_000_000  # Triton's, for a sequence batcher that sets none


def apply_defaults(
    config: ModelConfig, model_name: str, gpus: tuple[int, ...] | None = None, cpu_instances: int = 1
) -> None:
    """Fills the name, version policy and instance groups (an ensemble has none) as Triton does.

    The model's folder name is its name; a configuration that names another model is an error.
    `gpus` are the GPU ids the model's backend reports (None: it does not report); they decide
    where each instance group runs (see `coreserve.config.instance_groups`). A CPU group that
    sets no count has `cpu_instances` instances (the backend's `default_cpu_instance_count`),
    any other group one.
    """
    if not config.name:
        config.name = model_name
    elif config.name != model_name:
        raise ModelConfigError(
            f"model '{model_name}': config field 'name' is '{config.name}', "
            f"but the model's folder is named '{model_name}'"
        )
    if config.version_policy.WhichOneof("policy_choice") is None:
        config.version_policy.latest.num_versions = 1
    _normalize(config)
    if config.HasField("ensemble_scheduling"):
        # As Triton shows an ensemble: no instance group (it may name none: validation refuses
        # one), and always its transaction policy.
        config.model_transaction_policy.SetInParent()
        return
    if isinstance(cpu_instances, bool) or not isinstance(cpu_instances, int) or cpu_instances < 1:
        raise ModelConfigError(
            f"model '{model_name}': backend '{config.backend}' has default_cpu_instance_count "
            f"{cpu_instances!r}: a whole number of at least 1"
        )
    if not config.instance_group:
        # Triton names the group it adds after the model (instances `<model>_0`); groups the
        # configuration lists without a name are `<model>_<index>` (instances `<model>_<index>_<k>`).
        config.instance_group.add(name=config.name)
    for index, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{index}"
        unset = group.count < 1  # (as Triton: a count below 1 is no count)
        place_instance_group(config, group, gpus)
        if unset:  # Triton's SetDefaultInstanceCount, once the kind is known
            group.count = cpu_instances if group.kind == ModelInstanceGroup.KIND_CPU else 1


def _normalize(config: ModelConfig) -> None:
    """What Triton's NormalizeModelConfig fills in, so that a model's configuration reads as
    there: preferred batch sizes, the sequence idle time, pinned memory on (the server behaves
    the same either way: these are its defaults)."""
    batch = config.max_batch_size
    if config.HasField("dynamic_batching") and not config.dynamic_batching.preferred_batch_size and batch > 0:
        config.dynamic_batching.preferred_batch_size.append(batch)
    if config.HasField("sequence_batching"):
        batching = config.sequence_batching
        if not batching.max_sequence_idle_microseconds:
            batching.max_sequence_idle_microseconds = SEQUENCE_IDLE_DEFAULT_US
        if (
            batching.HasField("oldest")
            and not batching.oldest.preferred_batch_size
            and config.max_batch_size > 0
        ):
            batching.oldest.preferred_batch_size.append(config.max_batch_size)
    if not config.HasField("ensemble_scheduling"):
        optimization = config.optimization
        for field in ("input_pinned_memory", "output_pinned_memory"):
            if not optimization.HasField(field):
                getattr(optimization, field).enable = True
