"""The ensembles taken down with a model they use, or because it no longer fits them, until
they can load again."""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING

from coreserve.repository._overrides import LoadOverrides
from coreserve.repository.namespaces import ModelTable, qualified

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

    def __contains__(self, key: str) -> bool:
        return key in self._down

    def forget(self, name: str) -> None:
        """Loaded or unloaded by name: it is no longer brought back (nor kept down), in any
        namespace."""
        for key in [key for key, entry in self._down.items() if name in (key, entry[0])]:
            del self._down[key]

    def back(self, *keys: str) -> None:
        """Those ensembles loaded again (by key): no longer down."""
        for key in keys:
            self._down.pop(key, None)

    def drop_missing(self, found: Collection[str]) -> list[str]:
        """Forgets the ensembles held down whose keys are not `found` (their folders left); their keys."""
        missing = [key for key in self._down if key not in found]
        self.back(*missing)
        return missing

    def hold(self, models: ModelTable, key: str) -> list[str]:
        """Notes ensemble `key` taken down because the models it uses no longer fit it; the
        keys of the ensembles that use it, taken down with it (see `take_down`)."""
        self._note(key, models[key])
        return self.take_down(models, [key])

    def take_down(self, models: ModelTable, gone: Collection[str]) -> list[str]:
        """The keys of the ensembles that call a model `gone` names (by key), or call those,
        noted as taken down (Triton's words logged for each)."""
        down: list[str] = []
        unexplored = list(gone)
        while unexplored:
            step = unexplored.pop()
            for key, model in models.items():
                if key in gone or key in down or not calls(models, step, model.namespace, model.steps()):
                    continue
                logger.error("Invalid argument: %s", not_available(model.name, [models[step].name]))
                self._note(key, model)
                down.append(key)
                unexplored.append(key)
        return down

    def ready(self, loaded: str, models: ModelTable) -> list[tuple[str, str, LoadOverrides]]:
        """The ensembles taken down that call the model `loaded` names (by key) and find every
        step served now: name, key and what they were loaded with (`back` once loaded)."""
        return [
            (name, key, kept)
            for key, (name, namespace, steps, kept) in sorted(self._down.items())
            if calls(models, loaded, namespace, steps)
            and all(step_serves(models, namespace, step) for step in steps)
        ]

    def _note(self, key: str, model: Model) -> None:
        kept = LoadOverrides(config=model.config, traffic=model.traffic)
        self._down[key] = (model.name, model.namespace, model.steps(), kept)


def not_available(name: str, steps: Iterable[str]) -> str:
    """Triton's words for ensemble `name`, whose `steps` name models that do not serve."""
    return f"ensemble {name} contains models that are not available or ambiguous: {', '.join(steps)}"


def calls(models: ModelTable, key: str, namespace: str, steps: Collection[str]) -> bool:
    """Whether an ensemble of `namespace` whose steps name `steps` calls the model held under
    `key` (see `KeyIndex.step_key`)."""
    model = models.get(key)
    return model is not None and model.name in steps and models.index.step_key(namespace, model.name) == key


def step_serves(models: ModelTable, namespace: str, step: str) -> bool:
    """Whether the model an ensemble of `namespace` calls for `step` takes requests."""
    key = models.index.step_key(namespace, step)
    return key is not None and models[key].takes_requests


def users_of(models: ModelTable, key: str) -> list[tuple[str, Model]]:
    """The served ensembles that call the model held under `key`, by key."""
    return [
        (user, model)
        for user, model in sorted(models.items())
        if model.takes_requests and calls(models, key, model.namespace, model.steps())
    ]
