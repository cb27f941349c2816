"""The on-disk layout of a Triton model repository: model folders and numeric version folders.

<repository>/<model>/config.pbtxt
<repository>/<model>/<version>/<model file>

An ensemble's configuration names the models it uses: they load before it (`load_order`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from coreserve.config.parse import parse_config
from coreserve.errors import ModelConfigError
from coreserve.protos.model_config_pb2 import ModelVersionPolicy
from coreserve.repository.namespaces import qualified

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
