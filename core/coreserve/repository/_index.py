"""The repository index's entries: every model of the repositories and every served version."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

from coreserve.repository.memory._unloading import UNLOADED
from coreserve.repository.model import Model, ModelState


def index_entries(
    models: Mapping[str, Model],
    found: Mapping[str, str],
    unloaded: Mapping[str, list[int]],
    loading: set[str],
    *,
    ready_only: bool = False,
    extras: bool = False,
) -> list[dict[str, str]]:
    """The index, by model key: `models` held, `found` (key: plain name) in the repositories,
    `unloaded` the keys unloaded since (with the versions they had: each is listed "unloaded",
    as Triton keeps them), `loading` those a load is building a model for (LOADING
    while none is served, as Triton lists them). With `extras` (loading on demand or under a memory
    budget), a loaded version's entry also gives its model's `memory_bytes` (measured as it
    loaded) and `last_used` (UTC, ISO 8601)."""
    entries = []
    for key in sorted(set(found) | set(models)):
        model = models.get(key)
        name = model.name if model is not None else found[key]
        if model is None or not model.versions:
            if ready_only:
                continue
            if key in loading:
                entries.append({"name": name, "state": ModelState.LOADING.value})
                continue
            if model is None and unloaded.get(key):
                state = ModelState.UNAVAILABLE.value
                entries.extend(
                    {"name": name, "version": str(number), "state": state, "reason": UNLOADED}
                    for number in unloaded[key]
                )
                continue
            if model is None and key not in unloaded:
                entries.append({"name": name})  # never loaded: its name alone, as Triton lists it
                continue
            reason = model.reason if model is not None else UNLOADED
            entries.append({"name": name, "state": ModelState.UNAVAILABLE.value, "reason": reason})
            continue
        for number in sorted(model.versions):
            version = model.versions[number]
            if ready_only and version.current_state is not ModelState.READY:
                continue  # (the state, as the entry gives it: READY while instances restart)
            entry = {"name": name, "version": str(number), "state": version.current_state.value}
            if version.current_reason:
                entry["reason"] = version.current_reason
            if extras and model.memory_bytes is not None:
                entry["memory_bytes"] = str(model.memory_bytes)
                entry["last_used"] = datetime.fromtimestamp(model.last_used(), UTC).isoformat()
            entries.append(entry)
    return entries


def unavailable_reason(model: Model) -> str:
    """Why a model serves no version: its own reason, else each failed version's."""
    if model.reason:
        return model.reason
    # In Triton's words: "version 1 is at UNAVAILABLE state: <why>;" for each version that
    # failed (not for those unloaded because another failed, as Triton).
    reasons = [
        f"version {v.version} is at {v.current_state} state: {v.reason};"
        for v in model.versions.values()
        if v.reason and v.reason != UNLOADED
    ]
    return " ".join(reasons) or "it did not become ready"
