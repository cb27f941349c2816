"""The model repository: every model the server knows, loaded from the repository folders."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from coreserve.errors import NotFoundError
from coreserve.repository.layout import ensemble_steps, find_models
from coreserve.repository.loader import ModelLoader
from coreserve.repository.model import Model

logger = logging.getLogger(__name__)


class ModelRepository:
    """Loads the models of one or more repository folders and finds them by name."""

    def __init__(self, paths: list[Path], loader: ModelLoader) -> None:
        self.paths = paths
        self._loader = loader
        self._models: dict[str, Model] = {}

    async def load_all(self) -> None:
        """Loads every model of every repository folder, concurrently.

        Ensembles load after the models they are made of (so that they can check them), an
        ensemble of ensembles after those.
        """
        locations, duplicates = find_models(self.paths)
        for name, reason in duplicates.items():
            self._models[name] = Model(name=name, path=None, reason=reason)
        pending = {name: ensemble_steps(location) for name, location in locations.items()}
        while pending:
            ready = [name for name, steps in pending.items() if steps is None or not steps & pending.keys()]
            if not ready:  # ensembles that wait on each other: load them; they report the cycle
                ready = list(pending)
            loaded = await asyncio.gather(*(self._loader.load(locations[name]) for name in ready))
            for model in loaded:
                self._models[model.name] = model
            for name in ready:
                del pending[name]

    def get(self, name: str) -> Model:
        model = self._models.get(name)
        if model is None:
            raise NotFoundError(f"unknown model '{name}'")
        return model

    def models(self) -> list[Model]:
        return [self._models[name] for name in sorted(self._models)]

    def all_ready(self) -> bool:
        return all(model.ready for model in self._models.values())

    async def unload_all(self, timeout: float | None = None) -> None:
        """Lets queued requests finish (up to `timeout` seconds), then closes every instance."""
        schedulers = [
            version.scheduler
            for model in self._models.values()
            for version in model.versions.values()
            if version.scheduler is not None
        ]
        await asyncio.gather(*(scheduler.close(timeout) for scheduler in schedulers))
