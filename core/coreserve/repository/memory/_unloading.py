"""Closing model versions: a whole model when it is unloaded or replaced, or the versions
that loaded beside one that failed."""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Sequence
from pathlib import Path

from coreserve.repository._overrides import is_override_folder
from coreserve.repository.model import Model, ModelState, ModelVersion

logger = logging.getLogger(__name__)
# The reason the repository index gives for a version that was closed (Triton's word).
UNLOADED = "unloaded"


async def close_versions(name: str, versions: Sequence[ModelVersion], drain_timeout: float | None) -> bool:
    """Lets the versions' queued and running requests finish (up to `drain_timeout` seconds),
    closes their instances and marks them UNAVAILABLE, "unloaded". Returns whether every
    version closed in time (nothing was cut)."""
    # Versions closed already (those unloaded beside a version that failed) are not closed twice.
    versions = [v for v in versions if not (v.state is ModelState.UNAVAILABLE and v.reason == UNLOADED)]
    served = [version.version for version in versions if version.state is ModelState.READY]
    for version in versions:
        version.state = ModelState.UNLOADING
    in_time = await asyncio.gather(
        *(version.scheduler.close(drain_timeout) for version in versions if version.scheduler is not None)
    )
    for version in versions:
        version.state = ModelState.UNAVAILABLE
        version.reason = UNLOADED
    for number in served:  # (Triton's words)
        logger.info("successfully unloaded '%s' version %d", name, number)
    return all(in_time)


async def close_model(model: Model, drain_timeout: float | None, cache_dir: Path | None) -> bool:
    """Closes every version of a model, and removes the files a load request wrote for it.
    Returns whether it closed in time."""
    in_time = await close_versions(model.name, list(model.versions.values()), drain_timeout)
    if cache_dir is not None and model.path is not None and is_override_folder(model.path, cache_dir):
        shutil.rmtree(model.path, ignore_errors=True)
    return in_time


async def unload_loaded_versions(model: Model, drain_timeout: float | None) -> None:
    """Unloads the versions that loaded when another version of the model failed to.

    As Triton: a model with a version that failed serves no version at all (its repository
    index says "unloaded" for the others), so no client gets a half-loaded model.
    """
    loaded = [v for v in model.versions.values() if v.state is ModelState.READY]
    if not loaded:
        return
    await close_versions(model.name, loaded, drain_timeout)
    logger.info(
        "unloaded model '%s' version(s) %s: another version failed to load",
        model.name,
        ", ".join(str(v.version) for v in loaded),
    )
