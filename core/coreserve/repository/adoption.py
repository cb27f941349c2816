"""What a worker of a server of several loads to serve exactly what the others serve.

A worker that starts while others serve (one that died, started again) does not load the
repository as its files are now: they may hold what the others never loaded (a version staged
since, a file half copied). It takes on a serving worker's state (`snapshot`): each model with
the configuration and versions that worker loaded, from this repository's files, checked to be
the files that worker loaded (each file's path, size and modification time; a model worker 0
serves for the others is checked by its interface instead, `workers._forwarding`), and the
traffic policy that worker applies. A model it cannot
take on so is unavailable here with the reason; `adopt` returns those, and the worker is not
ready until they are mended (a load of the model through the repository API). A model another
worker failed to load is unavailable here too, for its reason, without a try.

The ensembles an unload took down with a model they use (`TakenDownEnsembles`) are entries
too (`taken_down`: their steps), so that the worker brings them back with the model as the
others do; and so is each model unloaded (`unloaded`: its key, with the versions it had), so
that the worker answers for it, and lists it in the index, as the others do.

`restore` puts one model back as a snapshot's entry had it: a change that held in some workers
but failed in others is undone so, and the ensembles that call it follow it as they follow a load.
"""

from __future__ import annotations

from typing import Any

from coreserve.config.json import config_from_dict, config_to_dict
from coreserve.errors import CoreserveError
from coreserve.repository._overrides import LoadOverrides
from coreserve.repository.manager import ModelRepository
from coreserve.repository.model import Model, ModelState
from coreserve.repository.namespaces import qualified
from coreserve.repository.traffic.policy import policy_from_document

Entry = dict[str, Any]


def snapshot_entry(model: Model) -> Entry:
    """What a worker serves of one model: the configuration and the versions it loaded (each
    with its files' fingerprint), or why it serves none."""
    ready = {
        str(number): version.files_fingerprint
        for number, version in model.versions.items()
        if version.state is ModelState.READY
    }
    return {
        "name": model.name,
        "namespace": model.namespace,
        "config": config_to_dict(model.config) if model.config is not None and ready else None,
        "versions": ready,
        "reason": "" if ready else model.reason or f"model '{model.name}' has no version loaded",
        "from_files": model.from_files,
        "traffic": model.traffic.as_dict() if model.traffic is not None else None,
    }


def snapshot(repository: ModelRepository) -> list[Entry]:
    """What this worker serves: an entry per model (`snapshot_entry`), per ensemble taken down
    and per model unloaded."""
    down = [
        {
            "name": name,
            "namespace": namespace,
            "config": config_to_dict(kept.config) if kept.config is not None else None,
            "traffic": kept.traffic.as_dict() if kept.traffic is not None else None,
            "taken_down": sorted(steps),
        }
        for name, namespace, steps, kept in repository.taken_down.items()
    ]
    unloaded = [{"unloaded": key, "versions": versions} for key, versions in repository.unloaded.items()]
    return [*(snapshot_entry(model) for model in repository.models()), *down, *unloaded]


async def adopt(repository: ModelRepository, entries: list[Entry]) -> dict[str, str]:
    """Serves what another worker's `snapshot` says it serves; returns the models that could not
    be taken on (by name), with why. Models that worker loaded from files sent with the load
    request are left out: their load is made again as it was asked."""
    plan: dict[str, LoadOverrides] = {}
    planned: list[Entry] = []
    faults: dict[str, str] = {}
    for entry in entries:
        if "unloaded" in entry:
            repository.unloaded[entry["unloaded"]] = list(entry["versions"])
            continue
        if "taken_down" in entry:
            config, traffic = entry["config"], entry["traffic"]
            kept = LoadOverrides(
                config=config_from_dict(config, f"model '{entry['name']}'") if config else None,
                traffic=policy_from_document(traffic) if traffic else None,
            )
            repository.taken_down.keep(
                entry["name"], entry["namespace"], frozenset(entry["taken_down"]), kept
            )
            continue
        if entry["from_files"]:
            continue
        try:
            if entry["versions"]:
                plan[_key(entry)] = _overrides(entry)
                planned.append(entry)
                continue
            reason = entry["reason"]  # not served there: not here either, for the same reason
        except CoreserveError as exc:  # a configuration this worker cannot read
            reason = faults[entry["name"]] = exc.message
        repository.mark_unavailable(_key(entry), entry["name"], entry["namespace"], reason)
    await repository.take_on(plan)
    for entry in planned:
        fault = _taken_on(repository, entry)
        if fault:
            faults[entry["name"]] = fault
            repository.mark_unavailable(_key(entry), entry["name"], entry["namespace"], fault)
        else:  # the policy that worker applies, whether its configuration's or one set since
            traffic = entry.get("traffic")
            repository.get(_key(entry)).traffic = policy_from_document(traffic) if traffic else None
    return faults


async def restore(repository: ModelRepository, name: str, entry: Entry | None, failure: str) -> str:
    """Puts model `name` back as `entry` had it, where a change of it failed in another worker
    with `failure`: as loaded then, or (None) not loaded, unavailable for that failure as it is
    there. "" where it is back, else why not."""
    if entry is None:  # (under namespacing, the change loaded the models of that name in every repository)
        held = [model for model in repository.models() if model.name == name]
        for model in held or [Model(name=name, path=None)]:
            repository.mark_unavailable(qualified(model.namespace, name), name, model.namespace, failure)
        fault = ""
    else:
        fault = (await adopt(repository, [entry])).get(name, "")
    await repository.restored(name)  # the ensembles that call it, as the change left them here
    return fault


def _key(entry: Entry) -> str:
    return qualified(entry["namespace"], entry["name"])


def _overrides(entry: Entry) -> LoadOverrides:
    config = config_from_dict(entry["config"], f"model '{entry['name']}' as another worker loaded it")
    return LoadOverrides(config=config, versions=tuple(sorted(int(number) for number in entry["versions"])))


def _taken_on(repository: ModelRepository, entry: Entry) -> str:
    """ "" where this worker serves the entry's versions from the same files, else why not."""
    name = entry["name"]
    model = next(
        (m for m in repository.models() if m.name == name and m.namespace == entry["namespace"]), None
    )
    if model is None:
        return f"model '{name}' is served by the other workers but is not in this worker's repository"
    for number, fingerprint in entry["versions"].items():
        version = model.versions.get(int(number))
        loaded = version.files_fingerprint if version is not None else ""
        if loaded and fingerprint and loaded != fingerprint:  # "": files it does not load itself
            return (
                f"the files of model '{name}' version {number} changed since the other workers loaded "
                "it: this worker cannot serve what they serve; load the model again through the "
                "repository API"
            )
        if version is None or version.state is not ModelState.READY:
            why = version.reason if version is not None else model.reason
            return f"model '{name}' version {number}, which the other workers serve, did not load here: {why}"
    return ""
