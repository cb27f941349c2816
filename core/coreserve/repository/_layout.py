"""The on-disk layout of a Triton model repository: model folders and numeric version folders.

<repository>/<model>/config.pbtxt
<repository>/<model>/<version>/<model file>
<repository>/<model>/<file every version uses> (label files, a Python environment's archive)

An ensemble's configuration names the models it uses: they load before it (`load_order`); the
links that follow from it are in `links`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from hashlib import blake2b
from pathlib import Path
from typing import TYPE_CHECKING

from coreserve.config.parse import parse_config
from coreserve.errors import CoreserveError, InvalidArgumentError, ModelConfigError
from coreserve.protos.model_config_pb2 import ModelConfig, ModelVersionPolicy
from coreserve.repository._overrides import LoadOverrides
from coreserve.repository.links import TakenDownEnsembles, linked, not_available
from coreserve.repository.namespaces import Found, KeyIndex, ModelTable, find_models, key_of, qualified
from coreserve.scheduling.cache.key import files_digest

if TYPE_CHECKING:
    from coreserve.repository.model import Model
    from coreserve.repository.storage._sources import RepositorySource

logger = logging.getLogger(__name__)

CONFIG_FILENAME = "config.pbtxt"


@dataclass(frozen=True)
class ModelLocation:
    """A model folder found in one of the repositories."""

    name: str
    path: Path
    repository: Path
    config_name: str = ""  # --model-config-name
    namespace: str = ""  # its repository, under --model-namespacing
    from_files: bool = False  # written from the files a load request carried, not a repository's
    copied: bool = False  # a copy of a remote repository's files: their times are the copy's

    @property
    def key(self) -> str:
        """What the repository holds the model under: its name, qualified by its namespace."""
        return qualified(self.namespace, self.name)

    @property
    def config_path(self) -> Path:
        """configs/<config_name>.pbtxt where the model has one (Triton's rule), else config.pbtxt."""
        if self.config_name:
            custom = self.path / "configs" / f"{self.config_name}.pbtxt"
            if custom.is_file():
                return custom
        return self.path / CONFIG_FILENAME


class ModelFinder:
    """Finds the models of the repositories: their keys, their folders on this machine and the
    models their ensembles use."""

    def __init__(self, sources: Sequence[RepositorySource], namespacing: bool, config_name: str) -> None:
        self._sources = sources
        self._namespacing = namespacing
        self._config_name = config_name  # --model-config-name
        # The repositories' namespaces (`key_of`): none without namespacing.
        self.namespaces = [source.label for source in sources] if namespacing else []

    async def scan(self) -> tuple[Found, dict[str, str]]:
        """Every model by key, and the names refused as found twice (see find_models)."""
        return await find_models(self._sources, self._namespacing)

    def refuse_missing_steps(
        self, name: str, namespace: str, steps: Iterable[str], found: Found, held: Collection[str]
    ) -> None:
        """Refuses the load of ensemble `name` where a step is neither in a repository (`found`)
        nor `held`, in Triton's words."""
        missing = [s for s in sorted(steps) if not self.keys_named(s, found)]
        missing = [s for s in missing if qualified(namespace, s) not in held]
        if missing:
            raise InvalidArgumentError(f"load failed for model '{name}': {not_available(name, missing)}")

    @staticmethod
    def steps_to_load(namespace: str, steps: Iterable[str], found: Found, models: ModelTable) -> list[str]:
        """The steps an ensemble of `namespace` loads first: those whose model its calls will
        take does not serve; its own repository's where it has one, else as `KeyIndex.step_key`
        finds it among the `models`."""
        wanted = []
        for step in sorted(steps):
            own = qualified(namespace, step)
            called = own if own in found else models.index.step_key(namespace, step)
            model = models.get(called or own)
            if model is None or not model.takes_requests:
                wanted.append(step)
        return wanted

    @staticmethod
    def still_down(
        locations: dict[str, ModelLocation], models: ModelTable, down: TakenDownEnsembles
    ) -> list[str]:
        """Takes out of `locations` (a poll found their files changed) the ensembles taken `down`
        (unloaded: a failed load loads again) that call a model which neither serves nor loads
        with them, and returns their keys: they stay down, as in Triton's polls, with the steps
        their files name now (Triton's words logged)."""
        index = KeyIndex(_names(models) | {key: location.name for key, location in locations.items()})
        uses = {key: ensemble_steps(location) for key, location in locations.items() if key in down}
        missing: dict[str, list[str]] = {}
        more = True
        while more:  # (one that stays down keeps down those that call it)
            more = False
            for key, steps in uses.items():
                if not steps or key in missing or key in models:
                    continue
                called = {step: index.step_key(locations[key].namespace, step) for step in sorted(steps)}
                gone = [
                    step for step, used in called.items() if not _available(used, locations, models, missing)
                ]
                if gone:
                    missing[key] = gone
                    more = True
        for key, gone in missing.items():
            location = locations.pop(key)
            logger.error("Invalid argument: %s", not_available(location.name, gone))
            down.keep(location.name, location.namespace, frozenset(uses[key] or ()), LoadOverrides())
        return list(missing)

    def keys_named(self, name: str, found: Found) -> list[str]:
        """The keys of the models called `name` among those found (one unless namespacing)."""
        if not self._namespacing:
            return [name] if name in found else []
        return [key for key, (source, _) in found.items() if key == key_of(source, name, True)]

    def split(self, key: str, source: RepositorySource) -> tuple[str, str]:
        """A found model's namespace ("" unless namespacing) and plain name."""
        namespace = source.label if self._namespacing else ""
        return namespace, key.removeprefix(qualified(namespace, "")) if namespace else key

    async def location(self, key: str, source: RepositorySource) -> ModelLocation:
        """The folder of a found model on this machine (a remote repository's is copied here)."""
        namespace, name = self.split(key, source)
        path = await asyncio.to_thread(source.local_path, name)
        return ModelLocation(
            name, path, path.parent, self._config_name, namespace, copied=source.copies_files
        )

    async def linked(
        self,
        name: str,
        overrides: LoadOverrides | None,
        models: Mapping[str, Model],
        down: TakenDownEnsembles,
    ) -> set[str]:
        """The models a change of model `name` touches: those linked to it through the ensembles
        served or taken `down`, and for a load (`overrides`) through the steps it will load."""
        uses = {model.name: model.steps() for model in models.values()}
        uses |= {ensemble: steps for ensemble, _, steps, _ in down.items()}
        start = {name}
        if overrides is not None and overrides.config is not None:
            start |= {step.model_name for step in overrides.config.ensemble_scheduling.step}
        if overrides is not None and not overrides.files:
            # Its folder's steps, of the repositories on this machine (a remote model's files are
            # not copied here before its load does it).
            found = {key: entry for key, entry in (await self.scan())[0].items() if not entry[0].copies_files}
            named = {key: found[key] for key in self.keys_named(name, found)}
            wanted = await self.with_steps(named, found)
            start |= {self.split(key, source)[1] for key, (source, _) in wanted.items()}
        return linked(start, uses)

    async def with_steps(self, wanted: Found, found: Found) -> Found:
        """The models wanted and, as Triton loads them, the steps of the ensembles among them:
        under namespacing, the step of the ensemble's own repository where it has one."""
        wanted = dict(wanted)
        unexplored = list(wanted)
        while unexplored:
            key = unexplored.pop()
            try:
                location = await self.location(key, wanted[key][0])
            except CoreserveError:
                continue  # its load records why it cannot load
            for step in ensemble_steps(location) or ():
                own = qualified(location.namespace, step)
                for wanted_key in [own] if own in found else self.keys_named(step, found):
                    if wanted_key not in wanted:
                        wanted[wanted_key] = found[wanted_key]
                        unexplored.append(wanted_key)
        return wanted


def ensemble_steps(location: ModelLocation, config: ModelConfig | None = None) -> set[str] | None:
    """The models an ensemble's configuration names (`config`, else the folder's), or None if it
    is no ensemble.

    A quick look at config.pbtxt for the order of loading; a configuration that does not parse
    is reported when the model loads.
    """
    path = location.config_path
    if config is None and not path.is_file():
        return None
    try:
        config = config if config is not None else parse_config(path.read_text(encoding="utf-8"))
    except (ModelConfigError, UnicodeDecodeError, OSError):
        return None
    if not config.HasField("ensemble_scheduling"):
        return None
    return {step.model_name for step in config.ensemble_scheduling.step}


def refuse_cycles(
    location: ModelLocation,
    steps: Collection[str],
    loading: Sequence[str],
    models: Mapping[str, Model],
    found: Collection[str],
) -> None:
    """Refuses to load ensemble `location` whose `steps` lead back to it: through the ensembles
    whose load led here (`loading`, outermost first) or through the models that serve. Its own
    repository's steps among the models `found` are loaded before it, so its calls take those."""
    name = location.name
    chain = [*loading, name]
    for step in sorted(steps):
        if step in chain:  # loading it first would never end
            cycle = " -> ".join([*chain[chain.index(step) :], step])
            raise InvalidArgumentError(f"cannot load ensemble '{name}': its steps form a cycle: {cycle}")
    own_steps = {qualified(location.namespace, step): step for step in steps}
    names = _names(models) | {key: step for key, step in own_steps.items() if key in found}
    index = KeyIndex(names | {location.key: name})
    uses = {location.key: index.step_keys(location.namespace, steps)}
    cycles = load_order(serving_steps(models, index) | uses)[1]
    if location.key in cycles:
        raise InvalidArgumentError(f"load failed for model '{name}': {cycles[location.key]}")


def list_versions(model_path: Path) -> list[int]:
    """The numeric version folders of a model, ascending (`0` among them, as Triton serves it);
    other entries, `07` among them, are ignored."""
    versions = []
    for entry in model_path.iterdir():
        if (
            entry.is_dir()
            and entry.name.isascii()
            and entry.name.isdigit()
            and (entry.name == "0" or not entry.name.startswith("0"))
        ):
            versions.append(int(entry.name))
    return sorted(versions)


def shared_files_fingerprint(model_path: Path) -> str:
    """What identifies the files of a model folder that every version uses (all but its
    configurations and version folders): each file's path, size and modification time
    (`files_digest`). A change to one reloads every version, as in Triton."""
    digest = blake2b(digest_size=8)
    try:
        entries = sorted(model_path.iterdir())
    except OSError:
        entries = []
    for entry in entries:
        if entry.name in (CONFIG_FILENAME, "configs") or (entry.name.isascii() and entry.name.isdigit()):
            continue
        digest.update(files_digest(model_path, sorted(entry.rglob("*")) if entry.is_dir() else [entry]))
    return digest.hexdigest()


Labels = dict[str, tuple[bytes, ...]]
# The labels of a loaded model version's outputs (name, version; "" the latest), for an ensemble.
LabelLookup = Callable[[str, str], Mapping[str, tuple[bytes, ...]]]


def read_output_labels(
    config: ModelConfig, model_path: Path, step_labels: LabelLookup | None = None
) -> Labels:
    """Labels per output that names a label file in the model folder: one label per line. An
    ensemble's output that names none takes those of the step output that produces it, as
    Triton's ensembles do (its steps are loaded first; `step_labels` looks them up).

    Read when a version loads, as Triton does: a file that cannot be read makes the version
    unavailable, with Triton's words for it. Lines split at '\\n' only (a '\\r' stays part of
    its label, as in Triton).
    """
    labels: dict[str, tuple[bytes, ...]] = {}
    for output in config.output:
        if not output.label_filename:
            continue
        path = model_path / output.label_filename
        try:
            text = path.read_bytes()
        except OSError as exc:
            raise ModelConfigError(
                f"failed to open text file for read {path}: {exc.strerror or exc} "
                f"(label_filename of output '{output.name}')"
            ) from None
        lines = text.split(b"\n")
        if lines and not lines[-1]:
            lines.pop()  # the newline that ends the last line opens no further one
        labels[output.name] = tuple(lines)
    if step_labels is not None and config.HasField("ensemble_scheduling"):
        unlabelled = {output.name for output in config.output} - labels.keys()
        for step in config.ensemble_scheduling.step:
            version = "" if step.model_version < 0 else str(step.model_version)
            for step_output, tensor in step.output_map.items():
                if tensor in unlabelled:
                    with contextlib.suppress(CoreserveError):  # (a step that does not serve has none)
                        found = step_labels(step.model_name, version).get(step_output)
                        if found:
                            labels[tensor] = found
    return labels


def select_versions(policy: ModelVersionPolicy, available: list[int], model_name: str) -> list[int]:
    """The versions a version policy serves out of the available ones."""
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        return list(available)
    if choice == "specific":
        wanted = sorted(set(policy.specific.versions))
        present = [v for v in wanted if v in available]
        if not present:
            raise ModelConfigError(
                f"model '{model_name}': version_policy asks for version(s) {wanted}, "
                f"but the model folder has {available or 'no version folders'}"
            )
        for version in sorted(set(wanted) - set(present)):  # as Triton: the others are served
            logger.error(
                "version %d is specified for model '%s', but the version directory is not present",
                version,
                model_name,
            )
        return present
    count = policy.latest.num_versions if choice == "latest" else 1
    return available[-count:] if available else []


def load_order(steps: Mapping[str, set[str] | None]) -> tuple[list[list[str]], dict[str, str]]:
    """Waves of models (by key) to load one after the other, each wave's models at once, from
    each model's ensemble steps (None: not an ensemble); and the ensembles that cannot load
    because their steps wait on each other, with the reason in Triton's words."""
    pending = dict(steps)
    waves: list[list[str]] = []
    while pending:
        ready = [key for key, uses in pending.items() if uses is None or not uses & pending.keys()]
        if not ready:
            return waves, {key: _cycle(key, pending) for key in pending}
        waves.append(ready)
        for key in ready:
            del pending[key]
    return waves, {}


def load_waves(
    locations: Mapping[str, ModelLocation], models: Mapping[str, Model]
) -> tuple[list[list[str]], dict[str, str]]:
    """`load_order` of the models at `locations` (by key), the models that serve and are not
    loaded again taking part as they are."""
    index = KeyIndex(_names(models) | {key: location.name for key, location in locations.items()})
    steps: dict[str, set[str] | None] = dict(serving_steps(models, index))
    for key, location in locations.items():
        uses = ensemble_steps(location)
        steps[key] = None if uses is None else index.step_keys(location.namespace, uses)
    return load_order(steps)


def _available(
    key: str | None,
    locations: Mapping[str, ModelLocation],
    models: Mapping[str, Model],
    held: Collection[str],
) -> bool:
    """Whether the model under `key` serves, or loads with those at `locations` (not `held` down)."""
    if key is None or key in held:
        return False
    return key in locations or (key in models and models[key].takes_requests)


def serving_steps(models: Mapping[str, Model], index: KeyIndex) -> dict[str, set[str]]:
    """The steps of each model that takes requests, as keys (`KeyIndex.step_keys`), for
    `load_order`: a cycle may run through models served already."""
    return {
        key: index.step_keys(model.namespace, model.steps())
        for key, model in models.items()
        if model.takes_requests
    }


def _names(models: Mapping[str, Model]) -> dict[str, str]:
    """Each model's plain name, by key."""
    return {key: model.name for key, model in models.items()}


def _cycle(start: str, pending: Mapping[str, set[str] | None]) -> str:
    """The cycle that `start` waits on, followed from it: every ensemble left waits on one."""
    path = [start]
    while True:
        following = min((pending[path[-1]] or set()) & pending.keys())
        if following in path:
            loop = [*path[path.index(following) :], following]
            return f"ensemble '{start}': circular dependency between ensembles: {' -> '.join(loop)}"
        path.append(following)
