"""What a model's load through the repository API does to the ensembles linked to it, as Triton
2.51's does (checked side by side): those taken down with it load again once every step serves;
the served ones that call it load again, and one it no longer fits goes down with the ensembles
that call it, until a model it uses loads again."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from coreserve.ensemble import misfit
from coreserve.errors import CoreserveError
from coreserve.repository._overrides import LoadOverrides
from coreserve.repository.links._taken_down import TakenDownEnsembles, step_serves, users_of

if TYPE_CHECKING:
    from coreserve.backend.api import InferenceClient
    from coreserve.repository.model import Model
    from coreserve.repository.namespaces import ModelTable

logger = logging.getLogger(__name__)

# Loads model `name` with the overrides, under that key only (its others' namespaces aside).
LoadKey = Callable[[str, LoadOverrides, str], Awaitable[object]]


class LinkedReloads:
    """The ensembles' part of a model's load; the repository's own steps are passed in."""

    def __init__(
        self,
        models: ModelTable,
        taken_down: TakenDownEnsembles,
        *,
        load: LoadKey,
        unload: Callable[[str], Awaitable[None]],
        mark_unavailable: Callable[[str, str, str, str], None],
        client_for: Callable[[str], InferenceClient | None],
    ) -> None:
        """`client_for`: the client an ensemble of that namespace calls its steps with."""
        self._models = models
        self._taken_down = taken_down
        self._load = load
        self._unload = unload
        self._mark_unavailable = mark_unavailable
        self._client_for = client_for

    async def after_load(self, loaded: Mapping[str, bool]) -> None:
        """Follows a load: `loaded`, the keys it loaded, each with whether it loaded anew (one
        whose files had not changed reloads no ensemble)."""
        self._taken_down.back(*loaded)
        back = await self._bring_back(list(loaded))
        await self._reload_users([key for key, anew in loaded.items() if anew], back | set(loaded))

    async def after_poll(self, before: Mapping[str, Model | None]) -> None:
        """Follows a poll's loads: `before`, the models it changed, as they were before it."""
        now = {key: self._models.get(key) for key in before}
        anew = {
            key: True
            for key, model in now.items()
            if model and model.takes_requests and model is not before[key]
        }
        await self.after_load(anew)  # (one that failed, and serves as it was, is checked as any other)

    async def after_restore(self, name: str) -> None:
        """Follows model `name` put back as it was (another worker's change undone here): as its
        load where it serves again; where it does not, the ensembles that call it go down."""
        for key in [key for key, model in self._models.items() if model.name == name]:
            if self._models[key].takes_requests:
                await self.after_load({key: True})
                continue
            for down in self._taken_down.take_down(self._models, [key]):
                await self._unload(down)

    def wait_for_steps(self, keys: Iterable[str]) -> None:
        """Polling, as Triton's dependency graph: the ensembles among `keys` that did not load
        while a model they use does not serve load (from their files) once it does."""
        for key in keys:
            model = self._models.get(key)
            if (
                model is not None
                and model.steps()
                and not model.takes_requests
                and not self._steps_serve(model)
            ):
                self._taken_down.keep(model.name, model.namespace, model.steps(), LoadOverrides())

    async def _bring_back(self, loaded: list[str]) -> set[str]:
        """Loads again the ensembles taken down that call a model `loaded` names and find every
        step served now (and so on, for those that call them); the keys of those back. One that
        fails stays down, for a later load to bring back."""
        back: set[str] = set()
        tried: set[str] = set()
        while loaded:
            if (called := loaded.pop()) not in self._models:
                continue  # (taken down, or evicted under a memory budget, since)
            for name, key, kept in self._taken_down.ready(called, self._models):
                if key in tried:
                    continue
                tried.add(key)
                try:
                    await self._load(name, kept, key)
                except CoreserveError as exc:
                    logger.error("ensemble '%s' did not load again: %s", name, exc.message)
                    continue
                self._taken_down.back(key)
                back.add(key)
                loaded.append(key)
        return back

    async def _reload_users(self, loaded: list[str], done: set[str]) -> None:
        """Loads again the served ensembles that call a model `loaded` names (and those that call
        them), but those `done`; one the models no longer fit goes down with its users."""
        while loaded:
            if (called := loaded.pop()) not in self._models:
                continue  # (taken down, or evicted under a memory budget, since)
            for key, model in users_of(self._models, called):
                if key in done or self._models.get(key) is not model or not self._steps_serve(model):
                    continue  # (loaded already through another path, or taken down meanwhile; see below)
                done.add(key)
                if reason := self._misfit(model):
                    for down in self._taken_down.hold(self._models, key):
                        await self._unload(down)
                    self._mark_unavailable(key, model.name, model.namespace, reason)
                    continue
                try:
                    await self._load(
                        model.name, LoadOverrides(config=model.config, traffic=model.traffic), key
                    )
                except CoreserveError as exc:
                    logger.error(
                        "ensemble '%s' did not load again, the loaded one keeps serving: %s",
                        model.name,
                        exc.message,
                    )
                    continue
                loaded.append(key)

    def _steps_serve(self, model: Model) -> bool:
        """Whether every step of ensemble `model` serves now: one that does not (evicted under a
        memory budget, it loads again on demand from the same files) neither takes the ensemble
        down nor has its load run for it; the ensemble is left as it is."""
        return all(step_serves(self._models, model.namespace, step) for step in model.steps())

    def _misfit(self, model: Model) -> str | None:
        """Why the models serving now do not fit ensemble `model` (a step's tensors)."""
        client = self._client_for(model.namespace)
        if client is None or model.config is None:
            return None
        return misfit(model.config, client.model_signature)
