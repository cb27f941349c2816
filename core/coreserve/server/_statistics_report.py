"""The statistics extension's answer: which model versions it reports, and its refusals."""

from __future__ import annotations

from typing import Any

from coreserve.errors import InvalidArgumentError, NotFoundError
from coreserve.repository import Model, ModelRepository, ModelVersion
from coreserve.repository.model import ModelState, parse_version


def statistics_of(repository: ModelRepository, name: str = "", version: str = "") -> dict[str, Any]:
    """Statistics of every model, of one model's versions, or of one version."""
    if not name:
        versions = [v for model in repository.models() for v in _loaded(model)]
        return {"model_stats": [v.statistics.as_dict() for v in versions]}
    # INVALID_ARG (HTTP 400) for an unknown model or version, as Triton 2.51 answers here; a
    # model that failed to load (no loaded version) is not available either.
    try:
        model = repository.get(name)
    except NotFoundError as exc:
        raise InvalidArgumentError(f"requested model '{name}' is not available ({exc.message})") from None
    versions = _loaded(model)
    if not versions:
        raise InvalidArgumentError(f"requested model '{name}' is not available (no version is loaded)")
    if version:
        number = parse_version(version)
        versions = [v for v in versions if v.version == number]
        if not versions:
            raise InvalidArgumentError(
                f"requested model version is not available for model '{name}' (version {number} is "
                "not loaded)"
            )
    return {"model_stats": [v.statistics.as_dict() for v in versions]}


def _loaded(model: Model) -> list[ModelVersion]:
    """The versions of a model that loaded, by number: those that statistics report, as Triton."""
    loaded = [version for version in model.versions.values() if version.state is ModelState.READY]
    return sorted(loaded, key=lambda version: version.version)
