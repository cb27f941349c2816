"""A model version's instances: creating one for each placement its instance groups ask for; and
what a reload keeps of the model it replaces: versions whose files and configuration are
unchanged, and, where only their instance groups changed, the instances alike in both."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from coreserve.backend.api import (
    Backend,
    InstanceKind,
    InstancePlacement,
    ModelFiles,
    ModelInstance,
    ServerContext,
)
from coreserve.backend.parameters import bool_parameter
from coreserve.protos.model_config_pb2 import ModelConfig, ModelInstanceGroup
from coreserve.repository.model import InstanceKey, Model, ModelVersion
from coreserve.scheduling.cache.key import version_fingerprint

if TYPE_CHECKING:
    from coreserve.repository._layout import ModelLocation

logger = logging.getLogger(__name__)
# A model parameter: a server of several workers keeps one copy of the model, in worker 0.
SINGLE_COPY_PARAMETER = "coreserve_single_copy"

_KINDS = {
    ModelInstanceGroup.KIND_CPU: InstanceKind.CPU,
    ModelInstanceGroup.KIND_GPU: InstanceKind.GPU,
    ModelInstanceGroup.KIND_MODEL: InstanceKind.MODEL,
}


async def create_instances(
    backend: Backend,
    files: ModelFiles,
    config: ModelConfig,
    placements: Sequence[InstancePlacement],
    context: ServerContext,
) -> list[ModelInstance]:
    """An instance for each placement, in their order: created one after another, or all at once
    where the backend says they may load so (its attribute `parallel_instance_loading`, as
    Triton's). If one fails, or the load is cancelled, those created are closed first."""
    created: list[ModelInstance] = []
    tasks: list[asyncio.Task[ModelInstance]] = []
    try:
        if not getattr(backend, "parallel_instance_loading", False):
            for placement in placements:
                created.append(await backend.create_instance(files, config, placement, context))
            return created
        for placement in placements:
            tasks.append(asyncio.ensure_future(backend.create_instance(files, config, placement, context)))
        if tasks:
            await asyncio.wait(tasks)  # every one ends, whichever fail
        return [task.result() for task in tasks]
    except BaseException:
        # To its end even if the load is cancelled again meanwhile: cut short, it would leave
        # the instances created running until the server stops.
        closing = asyncio.ensure_future(_close_created(created, tasks))
        cancelled = False
        while not closing.done():
            try:
                await asyncio.shield(closing)
            except asyncio.CancelledError:
                cancelled = True
        if cancelled:  # (after a failure: the load was cancelled too, which its caller must see)
            raise asyncio.CancelledError from None
        raise


async def _close_created(created: list[ModelInstance], tasks: list[asyncio.Task[ModelInstance]]) -> None:
    """Closes the instances a failed or cancelled load created, those still being created first
    stopped (a backend's create_instance closes what it began when it is cancelled)."""
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks)
    created += [task.result() for task in tasks if not task.cancelled() and task.exception() is None]
    for instance in created:
        with contextlib.suppress(Exception):
            await instance.close()


def grouped_placements(config: ModelConfig) -> list[tuple[ModelInstanceGroup, InstancePlacement]]:
    """Where each instance runs, beside the instance_group entry that asks for it; an ensemble,
    which has no instance group, runs in one instance of its own."""
    if config.HasField("ensemble_scheduling"):
        group = ModelInstanceGroup(name=config.name, kind=ModelInstanceGroup.KIND_CPU, count=1)
        return [(group, InstancePlacement(f"{config.name}_0", config.name, 0, InstanceKind.CPU, 0))]
    placements = []
    for group in config.instance_group:
        kind = _KINDS[group.kind]
        devices = list(group.gpus) if kind is InstanceKind.GPU and group.gpus else [0]
        for device_id in devices:
            for index in range(group.count):
                # Triton's name, `<group>_<k>`, whatever the count; a GPU group's instances on
                # different devices share it (their device id tells them apart).
                placement = InstancePlacement(
                    name=f"{group.name}_{index}",
                    group_name=group.name,
                    index=index,
                    kind=kind,
                    device_id=device_id,
                )
                placements.append((group, placement))
    return placements


def instance_key(group: ModelInstanceGroup, placement: InstancePlacement) -> InstanceKey:
    """What makes two instances alike across reloads: Triton's instance signature (the settings
    of their group but its name and count) and their device."""
    alike = ModelInstanceGroup()
    alike.CopyFrom(group)
    alike.ClearField("name")
    alike.count = 1
    return alike.SerializeToString(deterministic=True), placement.device_id


def plan_instance_changes(
    placed: Sequence[tuple[InstanceKey, ModelInstance]],
    wanted: Sequence[tuple[ModelInstanceGroup, InstancePlacement]],
) -> tuple[
    list[tuple[InstanceKey, ModelInstance]],
    list[tuple[ModelInstanceGroup, InstancePlacement]],
    list[ModelInstance],
]:
    """Which instances of those `placed` serve the `wanted` placements as they are (each
    matched to an alike one, the last placed first, as Triton matches them), which placements
    need a new instance, and which instances are left over: (kept, to create, to retire)."""
    left = list(placed)
    kept, create = [], []
    for group, placement in wanted:
        key = instance_key(group, placement)
        match = next((i for i in range(len(left) - 1, -1, -1) if left[i][0] == key), None)
        if match is None:
            create.append((group, placement))
        else:
            kept.append(left.pop(match))
    return kept, create, [instance for _, instance in left]


async def unchanged_versions(
    location: ModelLocation, model: Model, versions: Sequence[int], served: Model | None
) -> dict[int, ModelVersion]:
    """The versions of `served` that a reload to `model` keeps as they serve (Triton's rule): it
    loads from the same folder, the configurations differ in what `_but_instances` clears, and
    neither the version's files nor the files every version shares have changed. Never an
    ensemble's, a copied remote folder's (its times are the copy's) or one served by another
    worker (`files_fingerprint` empty). A kept version's instances may need to change
    (`plan_instance_changes`)."""
    config = model.config
    if (
        served is None
        or served.config is None
        or config is None
        or served.path != location.path
        or location.from_files
        or location.copied
        or config.HasField("ensemble_scheduling")
        or served.shared_files_fingerprint != model.shared_files_fingerprint
        or _but_instances(served.config) != _but_instances(config)
        or bool(single_copy_reason(served.config)) != bool(single_copy_reason(config))
    ):
        return {}
    kept = {}
    for number in versions:
        version = served.versions.get(number)
        if version is None or not version.takes_requests or not version.files_fingerprint:
            continue
        files = await asyncio.to_thread(version_fingerprint, location.path, number, "")
        if files == version.files_fingerprint:
            logger.info("model '%s' version %d is unchanged: it keeps serving", location.name, number)
            kept[number] = version
    return kept


def _but_instances(config: ModelConfig) -> ModelConfig:
    """The configuration but what a version that keeps serving may change: its version policy
    and its instance groups."""
    copy = ModelConfig()
    copy.CopyFrom(config)
    copy.ClearField("version_policy")
    copy.ClearField("instance_group")
    return copy


def single_copy_reason(config: ModelConfig) -> str:
    """Why a server of several workers must have one copy of a model, not one per worker (""
    where a copy per worker means what the configuration says). Raises ModelConfigError for a
    parameter `coreserve_single_copy` that is not true or false."""
    if config.HasField("sequence_batching"):
        return "sequence batching keeps a sequence on one instance"
    if any(group.kind == ModelInstanceGroup.KIND_GPU for group in config.instance_group):
        return "its GPU instances are counted per server"
    if bool_parameter(config, SINGLE_COPY_PARAMETER):
        return f"its configuration asks for one copy (parameter '{SINGLE_COPY_PARAMETER}')"
    return ""
