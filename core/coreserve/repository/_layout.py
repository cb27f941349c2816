"""The on-disk layout of a Triton model repository: model folders and numeric version folders.

<repository>/<model>/config.pbtxt
<repository>/<model>/<version>/<model file>

An ensemble's configuration names the models it uses: they load before it (`load_order`), and
an ensemble goes with a model it uses and comes back with it (`TakenDownEnsembles`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from coreserve.config.parse import parse_config
from coreserve.errors import ModelConfigError
from coreserve.protos.model_config_pb2 import ModelVersionPolicy
from coreserve.repository._overrides import LoadOverrides
from coreserve.repository.namespaces import qualified

if TYPE_CHECKING:
    from coreserve.repository.model import Model

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


def ensemble_steps(location: ModelLocation) -> set[str] | None:
    """The models an ensemble's configuration names, or None if the folder holds no ensemble.

    A quick look at config.pbtxt for the order of loading; a configuration that does not parse
    is reported when the model loads.
    """
    path = location.config_path
    if not path.is_file():
        return None
    try:
        config = parse_config(path.read_text(encoding="utf-8"))
    except (ModelConfigError, UnicodeDecodeError, OSError):
        return None
    if not config.HasField("ensemble_scheduling"):
        return None
    return {step.model_name for step in config.ensemble_scheduling.step}


def list_versions(model_path: Path) -> list[int]:
    """The numeric version folders of a model, ascending; other entries are ignored."""
    versions = []
    for entry in model_path.iterdir():
        if (
            entry.is_dir()
            and entry.name.isascii()
            and entry.name.isdigit()
            and not entry.name.startswith("0")
        ):
            versions.append(int(entry.name))
    return sorted(versions)


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


def _cycle(start: str, pending: Mapping[str, set[str] | None]) -> str:
    """The cycle that `start` waits on, followed from it: every ensemble left waits on one."""
    path = [start]
    while True:
        following = min((pending[path[-1]] or set()) & pending.keys())
        if following in path:
            loop = [*path[path.index(following) :], following]
            return f"ensemble '{start}': circular dependency between ensembles: {' -> '.join(loop)}"
        path.append(following)


class TakenDownEnsembles:
    """The ensembles an unload took down with a model they use, as Triton does, by name: their
    steps and what they were loaded with, to load them again once every step serves."""

    def __init__(self) -> None:
        self._down: dict[str, tuple[frozenset[str], LoadOverrides]] = {}

    def items(self) -> list[tuple[str, frozenset[str], LoadOverrides]]:
        """Each ensemble taken down: its name, steps and what it was loaded with."""
        return [(name, steps, kept) for name, (steps, kept) in sorted(self._down.items())]

    def keep(self, name: str, steps: frozenset[str], kept: LoadOverrides) -> None:
        """Notes an ensemble taken down elsewhere (by another worker, as it tells)."""
        self._down[name] = (steps, kept)

    def forget(self, name: str) -> None:
        """Loaded or unloaded by name: it is no longer brought back (nor kept down)."""
        self._down.pop(name, None)

    def take_down(self, models: Mapping[str, Model], name: str, keys: Collection[str]) -> list[str]:
        """The keys of the ensembles that use model `name`, or use those, noted as taken down
        (Triton's words logged for each); `keys`, the model's own, aside."""
        down: list[str] = []
        gone = [name]
        while gone:
            step = gone.pop()
            for key, model in models.items():
                if key in keys or key in down or step not in model.steps():
                    continue
                logger.error(
                    "Invalid argument: ensemble %s contains models that are not available or ambiguous: %s",
                    model.name,
                    step,
                )
                kept = LoadOverrides(config=model.config, traffic=model.traffic)
                self._down[model.name] = (model.steps(), kept)
                down.append(key)
                gone.append(model.name)
        return down

    def ready(self, loaded: str, serves: Callable[[str], bool]) -> list[tuple[str, LoadOverrides]]:
        """The ensembles taken down that use `loaded` and find every step served now, with
        what they were loaded with (forgotten here)."""
        ready = [
            (name, kept)
            for name, (steps, kept) in sorted(self._down.items())
            if loaded in steps and all(serves(step) for step in steps)
        ]
        for name, _ in ready:
            del self._down[name]
        return ready
