"""Where an `instance_group` runs: `KIND_AUTO` resolved and a `KIND_GPU` group's GPUs filled in,
as Triton's NormalizeInstanceGroup and ValidateInstanceGroup do, from the GPUs the model's
backend reports (see `coreserve.backend.devices`)."""

from __future__ import annotations

from coreserve.errors import ModelConfigError
from coreserve.protos.model_config_pb2 import ModelConfig, ModelInstanceGroup

AUTO, CPU, GPU = ModelInstanceGroup.KIND_AUTO, ModelInstanceGroup.KIND_CPU, ModelInstanceGroup.KIND_GPU


def depends_on_gpus(config: ModelConfig) -> bool:
    """Whether where the instances run depends on the GPUs there are (a group that is not
    KIND_CPU or KIND_MODEL, or no group at all): only then the backend is asked for them."""
    return not config.instance_group or any(group.kind in (AUTO, GPU) for group in config.instance_group)


def place_instance_group(
    config: ModelConfig, group: ModelInstanceGroup, gpus: tuple[int, ...] | None
) -> None:
    """Sets `group.kind` (never left KIND_AUTO) and, for a GPU group, `group.gpus`.

    :param config: the model's configuration (its name and backend name the model in errors).
    :param group: one of its instance groups, named already.
    :param gpus: the GPU ids the backend reports, or None for a backend that does not report:
        then `KIND_AUTO` is GPU only where `gpus` are listed, and a GPU group without `gpus`
        stays so (its instances go to GPU 0).
    :raises ModelConfigError: a `KIND_GPU` group with no GPU to run on, or listing one the
        backend cannot use.
    """
    if gpus is None:
        if group.kind == AUTO:
            group.kind = GPU if group.gpus else CPU
        return
    if group.kind == AUTO:
        # Listed GPUs say where the instances go; otherwise every GPU if there is one.
        group.kind = GPU if group.gpus or gpus else CPU
    if group.kind != GPU:
        return
    where = f"instance group {group.name} of model {config.name}"
    if not group.gpus:
        if not gpus:
            raise ModelConfigError(
                f"{where} has kind KIND_GPU but no GPUs are available "
                f"(backend '{config.backend}' reports no GPU it can use; use KIND_CPU or KIND_AUTO)"
            )
        group.gpus.extend(gpus)
    for gpu in group.gpus:
        if gpu not in gpus:
            usable = ", ".join(str(g) for g in gpus) or "none"
            raise ModelConfigError(
                f"{where} specifies invalid or unsupported gpu id {gpu}; "
                f"the GPUs backend '{config.backend}' can use are: {usable}"
            )
