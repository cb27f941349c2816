"""The ensembles taken down with a model they use, or because it no longer fits them, until
they can load again."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING

from coreserve.repository._overrides import LoadOverrides
from coreserve.repository.namespaces import qualified

if TYPE_CHECKING:
    from coreserve.repository.model import Model

logger = logging.getLogger(__name__)


class TakenDownEnsembles:
    """The ensembles an unload took down with a model they use, as Triton does, by key: their
    steps and what they were loaded with, to load them again once every step serves."""

    def __init__(self) -> None:
        self._down: dict[str, tuple[str, str, frozenset[str], LoadOverrides]] = {}

    def items(self) -> list[tuple[str, str, frozenset[str], LoadOverrides]]:
        """Each ensemble taken down: its name, namespace, steps and what it was loaded with."""
        return [self._down[key] for key in sorted(self._down)]

    def keep(self, name: str, namespace: str, steps: frozenset[str], kept: LoadOverrides) -> None:
        """Notes an ensemble taken down elsewhere (by another worker, as it tells)."""
        self._down[qualified(namespace, name)] = (name, namespace, steps, kept)

    def forget(self, name: str) -> None:
        """Loaded or unloaded by name: it is no longer brought back (nor kept down), in any
        namespace."""
        for key in [key for key, entry in self._down.items() if name in (key, entry[0])]:
            del self._down[key]

    def hold(self, models: Mapping[str, Model], key: str) -> list[str]:
        """Notes ensemble `key` taken down because the models it uses no longer fit it; the
        keys of the ensembles that use it, taken down with it (see `take_down`)."""
        model = models[key]
        kept = LoadOverrides(config=model.config, traffic=model.traffic)
        self._down[key] = (model.name, model.namespace, model.steps(), kept)
        return self.take_down(models, model.name, [key])

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
                self._down[key] = (model.name, model.namespace, model.steps(), kept)
                down.append(key)
                gone.append(model.name)
        return down

    def ready(self, loaded: str, serves: Callable[[str], bool]) -> list[tuple[str, str, LoadOverrides]]:
        """The ensembles taken down that use `loaded` and find every step served now: name,
        key and what they were loaded with (forgotten here)."""
        ready = [
            (name, key, kept)
            for key, (name, _, steps, kept) in sorted(self._down.items())
            if loaded in steps and all(serves(step) for step in steps)
        ]
        for _, key, _ in ready:
            del self._down[key]
        return ready


def users_of(models: Mapping[str, Model], name: str) -> list[tuple[str, Model]]:
    """The served ensembles that use model `name`, by key."""
    return [
        (key, model)
        for key, model in sorted(models.items())
        if name in model.steps() and model.takes_requests
    ]
