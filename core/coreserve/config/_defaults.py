"""Defaults the core fills into every model configuration before validation."""

from __future__ import annotations

from coreserve.config.instance_groups import place_instance_group
from coreserve.errors import ModelConfigError
from coreserve.protos.model_config_pb2 import ModelConfig


def apply_defaults(config: ModelConfig, model_name: str, gpus: tuple[int, ...] | None = None) -> None:
    """Fills the name, version policy and instance groups as Triton does.

    The model's folder name is its name; a configuration that names another model is an error.
    `gpus` are the GPU ids the model's backend reports (None: it does not report); they decide
    where each instance group runs (see `coreserve.config.instance_groups`).
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
    if not config.instance_group:
        # Triton names the group it adds after the model (instances `<model>_0`); groups the
        # configuration lists without a name are `<model>_<index>` (instances `<model>_<index>_<k>`).
        config.instance_group.add(name=config.name)
    for index, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{index}"
        if group.count < 1:  # as Triton: a count below 1 is one instance
            group.count = 1
        place_instance_group(config, group, gpus)
