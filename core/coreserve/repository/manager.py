"""The model repository: which models the server serves, and their loading, reloading and unloading.

Control modes, as tritonserver's `--model-control-mode`:
- none: every model of the repositories loads at start-up; the repository API may not change them;
- poll: as none, then the repositories are scanned every few seconds and added, changed and
  removed models are loaded, reloaded and unloaded;
- explicit: only the models named at start-up (`--load-model`, `*` for all) load; the
  repository API loads and unloads.

A reload never drops a request: the new model loads beside the old one, new requests go to it
once it is ready, requests already queued finish on the old one, which then closes. If the new
one fails, the old one keeps serving. A version whose files and configuration (but for the
version policy) are unchanged is not loaded again: it moves to the new model, as in Triton.

Without `--model-namespacing` a model name found in two repositories is refused; with it,
each repository is a namespace and models are held under qualified keys (see namespaces.py).
In explicit mode, loads on demand and a memory budget go beyond Triton: see budgeted.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from coreserve.errors import CoreserveError, InvalidArgumentError, UnavailableError, UnsupportedError
from coreserve.repository._index import index_entries, unavailable_reason
from coreserve.repository._layout import ModelFinder, ModelLocation, ensemble_steps, load_waves, refuse_cycles
from coreserve.repository._loader import ModelLoader
from coreserve.repository._overrides import LoadOverrides, not_in_repository, write_override_files
from coreserve.repository.links import LinkedReloads, RelatedChanges, TakenDownEnsembles
from coreserve.repository.memory._budgeted import BudgetedLoads
from coreserve.repository.memory._unloading import close_model, unload_loaded_versions
from coreserve.repository.memory.budgets import MemoryBudgets
from coreserve.repository.model import Model
from coreserve.repository.namespaces import Found, ModelTable
from coreserve.repository.storage._folders import check_model_name
from coreserve.repository.storage._sources import RepositorySource

logger = logging.getLogger(__name__)


class ControlMode(enum.StrEnum):
    NONE = "none"
    POLL = "poll"
    EXPLICIT = "explicit"


class ModelRepository:
    """The served models, found in one or more repository sources."""

    def __init__(
        self,
        sources: Sequence[RepositorySource],
        loader: ModelLoader,
        *,
        mode: ControlMode = ControlMode.NONE,
        startup_models: Sequence[str] = ("*",),
        load_threads: int = 4,
        cache_dir: Path | None = None,
        drain_timeout: float | None = None,
        namespacing: bool = False,
        on_demand: bool = False,
        memory_budgets: MemoryBudgets | None = None,
    ) -> None:
        """`on_demand`, `memory_budgets`: see the module's docstring (explicit mode only). Raises
        MemoryBudgetError where a GPU's budget cannot be kept (NVML cannot read that GPU)."""
        self.sources = list(sources)
        self.mode = mode
        self.namespacing = namespacing
        self._loader = loader
        self._startup_models = list(startup_models)
        self._limit = asyncio.Semaphore(max(1, load_threads))
        self._cache_dir = cache_dir
        self._drain_timeout = drain_timeout
        self._models = ModelTable()  # by key: the name, qualified by its namespace under namespacing
        self._find = ModelFinder(self.sources, namespacing, loader.config_name)
        self._fingerprints: dict[str, str] = {}
        # The keys unloaded, with the versions they had (shared with `budgeted`: changed in place).
        self.unloaded: dict[str, list[int]] = {}
        self._loading: set[str] = set()  # keys a load is building a model for, as the index says
        self.taken_down = TakenDownEnsembles()
        self.linked_reloads = LinkedReloads(
            self._models, self.taken_down, unload=functools.partial(self._unload, retry=False),
            mark_unavailable=functools.partial(self.mark_unavailable, retry=False),
            load=self._load_linked,
            client_for=functools.partial(loader.client_for, "ensemble"),
        )  # fmt: skip
        self._changes = RelatedChanges()
        self._locks: dict[str, asyncio.Lock] = {}
        self._closing: set[asyncio.Task[bool]] = set()
        self.budgeted = BudgetedLoads(
            self._models, self.unloaded, loader, find=self.get, lock=self._lock, close=self._close,
            load=lambda name: self._load(name, LoadOverrides(), (), reason="demand"),
            on_demand=on_demand and mode is ControlMode.EXPLICIT,
            memory_budgets=memory_budgets or MemoryBudgets(),
        )  # fmt: skip
        if namespacing:
            loader.has_model = self._models.__contains__

    # What is served.

    def get(self, name: str) -> Model:
        """The model a request names; under namespacing, the one repository that has that name."""
        return self._models.find(name, self.unloaded, self._find.namespaces)

    def models(self) -> list[Model]:
        return [self._models[key] for key in sorted(self._models)]

    def models_unordered(self) -> Iterable[Model]:
        """The models without sorting them: for what sums over them on every execution."""
        return self._models.values()

    def all_ready(self, listed_too: bool = False) -> bool:
        """What the server's readiness says; `listed_too`: the names only the index lists count
        (a start that failed for them, under --exit-on-error, as Triton's does)."""
        return all(model.ready for model in self._models.values() if listed_too or not model.index_only)

    # Start-up and polling.

    async def start(self) -> None:
        """Loads what the control mode loads at start-up."""
        found, duplicates = await self._find.scan()
        for name, reason in duplicates.items():
            self._models[name] = Model(name=name, path=None, reason=reason, index_only=True)
        if self.mode is ControlMode.EXPLICIT:  # pinned: never unloaded to make room
            pinned = {key for name in self._startup_models for key in self._find.keys_named(name, found)}
            self.budgeted.pinned = pinned | (set(found) if "*" in self._startup_models else set())
        if self.mode is ControlMode.EXPLICIT and "*" not in self._startup_models:
            wanted = {}
            for name in self._startup_models:
                keys = self._find.keys_named(name, found)  # under namespacing: every repository's
                wanted.update({key: found[key] for key in keys})
                if not keys:
                    reason = f"model '{name}' is not in the repository"
                    self._models[name] = Model(name=name, path=None, reason=reason, index_only=True)
            found = await self._find.with_steps(wanted, found)
        await self._load_many(found, "startup")

    async def take_on(self, plan: Mapping[str, LoadOverrides]) -> None:
        """Loads the models `plan` names (by key) with its overrides, whatever the control mode: a
        worker of a server of several taking on what the others serve (`adoption`). A model no
        repository holds is left out; the caller finds it missing."""
        found, _ = await self._find.scan()
        await self._load_many({key: found[key] for key in plan if key in found}, "startup", plan)

    def mark_unavailable(self, key: str, name: str, namespace: str, reason: str, retry: bool = True) -> None:
        """Holds the model under `key` as unavailable with `reason`, closing what it had loaded
        (a poll then loads it again, where `retry`)."""
        old = self._models.get(key)
        self._models[key] = Model(name=name, path=None, reason=reason, namespace=namespace)
        if retry:
            self._fingerprints.pop(key, None)
        if old is not None:
            self.budgeted.release(key)
            self._close_later(old)

    async def _load_many(
        self,
        found: Found,
        reason: str,
        overrides: Mapping[str, LoadOverrides] | None = None,
    ) -> None:
        """Loads models concurrently (each with its `overrides`, if any); ensembles after the
        models they are made of."""
        locations: dict[str, ModelLocation] = {}
        for key, (source, _) in found.items():
            try:
                locations[key] = await self._find.location(key, source)
            except CoreserveError as exc:
                namespace, name = self._find.split(key, source)
                self._models[key] = Model(name=name, path=None, reason=exc.message, namespace=namespace)
        if reason == "poll":  # (as Triton's: an ensemble held down stays down while a model it uses is gone)
            held = self._find.still_down(locations, self._models, self.taken_down)  # (out of `locations`)
            self._fingerprints.update({key: found[key][1] for key in held})  # (until that model serves)
        waves, cycles = load_waves(locations, self._models)
        for key, why in cycles.items():
            if key not in locations:
                continue
            name = locations[key].name
            served = self._models.get(key)
            if served is not None and served.takes_requests:  # (a poll saw an ensemble edited into a cycle)
                logger.error("model '%s' did not reload, the loaded version keeps serving: %s", name, why)
                self._fingerprints[key] = found[key][1]  # tried again once its files change
            else:
                self.mark_unavailable(key, name, locations[key].namespace, why)
        for wave in waves:
            await asyncio.gather(
                *(
                    self._replace(locations[key], found[key][1], (overrides or {}).get(key), reason=reason)
                    for key in wave
                    if key in locations
                )
            )
        if self.mode is ControlMode.POLL:  # (and once its load failed for want of a model it uses)
            self.linked_reloads.wait_for_steps(found)

    async def poll(self) -> None:
        """Applies what changed in the repositories since the last look (poll mode)."""
        found, duplicates = await self._find.scan()
        known = self._fingerprints  # (of the models found once: one held down for a model it uses too)
        changed = {
            key: found[key] for key in found if known.get(key) != found[key][1] and key not in duplicates
        }
        left = sorted(set(self._models) - set(found))
        gone = [key for key in left if key in known or key in duplicates or self._models[key].path]
        for key in self.taken_down.drop_missing(found):  # (down, then gone)
            known.pop(key, None)
        down = self.taken_down.take_down(self._models, gone)  # as Triton 2.51's polls (checked side by side)
        for key in [*down, *gone]:
            if key in gone:
                logger.info("model '%s' left the repository; unloading it", key)
            await self._unload(key, retry=key in gone)  # (down: it loads with a model it uses, not alone)
        if changed:
            logger.info("repository changes found for: %s", ", ".join(sorted(changed)))
            before = {key: self._models.get(key) for key in changed}
            await self._load_many(changed, "poll")
            await self.linked_reloads.after_poll(before)

    # Loading and unloading.

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    async def _replace(
        self,
        location: ModelLocation,
        fingerprint: str | None,
        overrides: LoadOverrides | None = None,
        *,
        reason: str,
    ) -> Model:
        """Loads a model beside the one being served and switches to it when it is ready.

        Returns the new model; if it could not load, the old one (if any) keeps serving.
        `reason` (startup, poll, explicit, demand) is counted by the metrics; a load on demand
        of a model that another load made ready meanwhile returns that one.
        """
        key = location.key
        async with self._lock(key), self._limit, self.budgeted.measuring:
            old = self._models.get(key)
            if reason == "demand" and old is not None and old.takes_requests:
                return old
            self._loading.add(key)
            try:
                new = await self.budgeted.measured_load(location, overrides, reason, old)
            finally:
                self._loading.discard(key)
            if fingerprint is not None:
                self._fingerprints[key] = fingerprint
            asked = overrides.traffic if overrides is not None else None
            # (checked again: a load measured for a memory budget was not given the served model)
            failed = not new.takes_requests or not new.keep_traffic_of(old, asked)
            if failed and old is not None and old.takes_requests:
                logger.error(
                    "model '%s' did not reload, the loaded version keeps serving: %s",
                    location.name,
                    unavailable_reason(new),
                )
                new.settle_kept(old, serves=False)
                self._close_later(new)
                return new
            new.settle_kept(old, serves=True)
            if failed:
                await unload_loaded_versions(new, self._drain_timeout)
                self.budgeted.release(key)
            else:
                self.budgeted.lifecycle.loads[reason] += 1
                adopted = overrides is not None and overrides.versions is not None  # (another worker's word)
                new.source_fingerprint = None if adopted else fingerprint
            self._models[key] = new
            self.unloaded.pop(key, None)
            if old is not None:
                self._close_later(old)
            return new

    def _close_later(self, model: Model) -> None:
        """Closes a model once its queued and running requests have finished."""
        task = asyncio.create_task(self._close(model), name=f"close:{model.name}")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _close(self, model: Model) -> bool:
        return await close_model(model, self._drain_timeout, self._cache_dir)

    def _refuse_unless_explicit(self, action: str) -> None:
        if self.mode is not ControlMode.EXPLICIT:  # Triton's code and words, then the way out
            raise UnavailableError(
                "explicit model load / unload is not allowed if polling is enabled "
                f"({action} needs --model-control-mode=explicit; this server runs in mode {self.mode.value})"
            )

    async def load(self, name: str, overrides: LoadOverrides | None = None, by_model: bool = False) -> None:
        """Loads or reloads a model (explicit mode); raises with the reason if it cannot load.
        The ensembles linked to it follow (`LinkedReloads`: those taken down come back, those
        served load again or go down where it no longer fits them). A load a model asks for
        (`by_model`) does not wait for changes of linked models: one of them may be the load
        that runs that model."""
        self._refuse_unless_explicit("loading models")
        overrides = overrides or LoadOverrides()
        linked = functools.partial(self._find.linked, name, overrides, self._models, self.taken_down)
        async with self._changes.holding(f"load of model '{name}'", linked, by_model):
            loaded = await self._load(name, overrides, ())
            self.taken_down.forget(name)
            await self.linked_reloads.after_load(loaded)

    async def _load_linked(self, name: str, overrides: LoadOverrides, key: str) -> object:
        """Loads a linked ensemble again: polling, from its files, else as it was loaded (`overrides`)."""
        if self.mode is ControlMode.POLL:
            return await self._load(name, LoadOverrides(), (), reason="poll", only=key)
        return await self._load(name, overrides, (), only=key)

    async def restored(self, name: str) -> None:
        """The ensembles linked to model `name` follow it, put back after another worker failed its change."""
        linked = functools.partial(self._find.linked, name, None, self._models, self.taken_down)
        async with self._changes.holding(f"undo of a change of model '{name}'", linked):
            await self.linked_reloads.after_restore(name)

    async def _load(
        self,
        name: str,
        overrides: LoadOverrides,
        loading: tuple[str, ...],
        reason: str = "explicit",
        only: str | None = None,
    ) -> dict[str, bool]:
        """Loads a model (under namespacing, `only` that key of its name); `loading` names the
        ensembles whose load led here, outermost first. Returns the keys loaded, each with
        whether it loaded anew (its files or configuration changed)."""
        check_model_name(name)
        if overrides.files:
            if self._cache_dir is None:
                raise UnsupportedError("loading models from files needs a cache folder")
            path = await asyncio.to_thread(write_override_files, self._cache_dir, name, overrides.files)
            location = ModelLocation(name, path, path.parent, self._loader.config_name, from_files=True)
            return {location.key: await self._load_location(name, location, None, overrides, reason)}
        found, duplicates = await self._find.scan()
        if name in duplicates:
            raise InvalidArgumentError(duplicates[name])
        keys = [key for key in self._find.keys_named(name, found) if only in (None, key)]
        if not keys:
            raise not_in_repository(name, on_demand=reason == "demand")
        held = {known for known, model in self._models.items() if model.path is not None}
        loaded: dict[str, bool] = {}
        # Under namespacing, as Triton: a name loads the models of that name in every repository.
        for key in keys:
            location = await self._find.location(key, found[key][0])
            steps = ensemble_steps(location, overrides.config) or set()
            refuse_cycles(location, steps, loading, self._models, found)
            self._find.refuse_missing_steps(name, location.namespace, steps, found, held)
            for step in self._find.steps_to_load(location.namespace, steps, found, self._models):
                logger.info("loading model '%s' first: ensemble '%s' uses it", step, name)
                loaded |= await self._load(step, LoadOverrides(), (*loading, name), reason)
            loaded[key] = await self._load_location(name, location, found[key][1], overrides, reason)
        return loaded

    async def _load_location(
        self,
        name: str,
        location: ModelLocation,
        fingerprint: str | None,
        overrides: LoadOverrides,
        reason: str,
    ) -> bool:
        """Loads the model at `location`; whether it loaded anew (not where nothing changed)."""
        served = self._models.get(location.key)
        # As Triton: a load that changes nothing keeps what serves (a configuration it was given too).
        if (
            reason == "explicit"
            and overrides == LoadOverrides()
            and served
            and served.loaded_from(fingerprint)
        ):
            logger.info("model '%s' is loaded from these files already: nothing to reload", name)
            return False
        new = await self._replace(location, fingerprint, overrides, reason=reason)
        if self._models.get(location.key) is not new:
            why = f"{unavailable_reason(new)} (the loaded version keeps serving)"
            raise InvalidArgumentError(f"load failed for model '{name}': {why}")
        if not new.takes_requests:
            raise InvalidArgumentError(f"load failed for model '{name}': {unavailable_reason(new)}")
        return True

    async def unload(self, name: str, dependents: bool = False, by_model: bool = False) -> None:
        """Unloads a model (explicit mode) and the ensembles that use it, until it loads again.
        `dependents` (`unload_dependents`) changes nothing to that: Triton would also unload the
        steps an ensemble's load alone brought in (not built here; see docs). `by_model`: as for
        `load`."""
        self._refuse_unless_explicit("unloading models")
        check_model_name(name)
        async with self._changes.holding(
            f"unload of model '{name}'",
            lambda: self._find.linked(name, None, self._models, self.taken_down),
            by_model,
        ):
            self.taken_down.forget(name)  # unloaded by name: it stays unloaded
            # Under namespacing, as Triton: a name unloads the models of that name in every repository.
            keys = [key for key, model in self._models.items() if key == name or model.name == name]
            if not keys:
                return  # Triton answers success: a model that is not loaded is unloaded already
            for key in [*self.taken_down.take_down(self._models, keys), *keys]:
                await self._unload(key)

    async def _unload(self, name: str, retry: bool = True) -> None:
        """Unloads a model (`retry`: as `mark_unavailable`)."""
        async with self._lock(name):
            model = self._models.pop(name, None)
            if retry:
                self._fingerprints.pop(name, None)
            if model is None:
                return
            self.unloaded[name] = sorted(model.versions)
            self.budgeted.release(name)
            logger.info("unloading model '%s'", name)
            await self._close(model)

    async def unload_all(self, timeout: float | None = None) -> bool:
        """Lets queued requests finish (up to `timeout` seconds), then closes every instance.
        Loads under way are given up: the backends stop what they run for them. Returns whether
        all of it ended in time (no request or instance was cut)."""
        self._loader.stop_loads()
        self._drain_timeout = timeout
        models = list(self._models.values())
        self._models.clear()
        in_time = all(await asyncio.gather(*(self._close(model) for model in models)))
        for task in list(self._closing):  # the replaced models still draining
            with contextlib.suppress(asyncio.CancelledError):
                in_time = await task and in_time
        self.budgeted.close()
        return in_time

    # The repository index.

    async def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Every model of the repositories and every served version, with state and reason
        (and, loading on demand or under a memory budget, memory and last use: see index.py)."""
        found, _ = await self._find.scan()
        names = {key: self._find.split(key, source)[1] for key, (source, _) in found.items()}
        extras = self.budgeted.on_demand or self.budgeted.has_budget
        return index_entries(
            self._models, names, self.unloaded, self._loading, ready_only=ready_only, extras=extras
        )
