"""The model repository's loads under a memory budget and on demand: measuring each load,
making room by unloading the least recently used models, and sharing one load on demand among
the requests that wait for it.

In explicit mode, two choices go beyond Triton (nothing changes without them):
- on demand (`--model-load-on-demand`): a request for a model of the repository that is not
  loaded loads it (see demand.py); a model whose load on demand failed is tried again by a
  request that comes after a back-off, 5 s after the failure, then twice as long after each
  (at most 5 minutes); until then its requests get its reason (a model that failed to load
  otherwise, at start-up or through the API, is tried by its first request; a load through
  the repository API tries again at any time);
- a memory budget (`--model-memory-budget`): each model's memory is measured as it loads (see
  memory.py); a load that would pass the budget first unloads the least recently used models
  with no request in flight, never a pinned one (named by `--load-model`, or with the
  configuration parameter `coreserve_pinned`), never an ensemble (its steps hold the
  memory) nor, unless on demand, a model a serving ensemble uses; and fails, naming the
  budget, if that is not enough. Under a budget, models load one at a time, so that each
  measurement is its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager

from coreserve.backend.parameters import bool_parameter
from coreserve.errors import CoreserveError, NotFoundError
from coreserve.repository._layout import ModelLocation
from coreserve.repository._loader import ModelLoader
from coreserve.repository._overrides import LoadOverrides
from coreserve.repository.memory._gpu import GpuMemoryReader
from coreserve.repository.memory.budgets import (
    MemoryBudgets,
    ModelMemory,
    ModelMemoryBudgetError,
    megabytes,
    process_tree_rss,
)
from coreserve.repository.memory.demand import DemandLoads, LifecycleCounts
from coreserve.repository.model import Model, ModelState
from coreserve.repository.namespaces import ModelTable

logger = logging.getLogger(__name__)
# A model configuration's parameter that keeps a model from being unloaded to make room.
PINNED_PARAMETER = "coreserve_pinned"
# A name a request asked for that is not in the repository is not looked for again for this
# long (a client asking for unknown names must not scan the repository at each request).
ABSENT_FOR_S = 2.0
# A model whose load failed is loaded on demand again this long after the last try, doubled
# after each try that fails, up to the most.
RETRY_FIRST_S = 5.0
RETRY_MOST_S = 300.0
MAX_ABSENT_NAMES = 10_000


class BudgetedLoads:
    """What the `ModelRepository` that owns it adds to its loads for a memory budget and for
    loading on demand: given the repository's model table, its unloaded keys (with the versions
    each had) and the
    calls it answers (a model's lock, closing a model, loading a model by name)."""

    def __init__(
        self,
        models: ModelTable,
        unloaded: dict[str, list[int]],
        loader: ModelLoader,
        *,
        find: Callable[[str], Model],
        lock: Callable[[str], asyncio.Lock],
        close: Callable[[Model], Awaitable[object]],
        load: Callable[[str], Awaitable[object]],
        on_demand: bool,
        memory_budgets: MemoryBudgets,
    ) -> None:
        """Raises MemoryBudgetError where a GPU's budget cannot be kept (NVML cannot read it)."""
        self._models = models
        self._unloaded = unloaded
        self._loader = loader
        self._find = find  # the model a request names (ModelRepository.get)
        self._lock = lock
        self._close = close
        self._load = load  # a load of that name, as a request's on demand
        self.on_demand = on_demand
        self.memory = ModelMemory(memory_budgets.host)  # the host's
        # The reader of the budgeted GPUs' used memory, and each one's budget, by id.
        self._gpus = GpuMemoryReader.open(memory_budgets.gpus) if memory_budgets.gpus else None
        in_bytes = self._gpus.in_bytes(memory_budgets.gpus) if self._gpus else {}
        self.gpu_memory = {gpu: ModelMemory(size, f"GPU {gpu}") for gpu, size in in_bytes.items()}
        self.lifecycle = LifecycleCounts()
        self._demand = DemandLoads(self._load_on_demand, self.lifecycle)
        self.pinned: set[str] = set()  # keys named by --load-model
        self._absent: dict[str, float] = {}  # names not in the repository, until when it is believed
        self._retries: dict[str, tuple[float, float]] = {}  # a failed model's next try: (when, back-off)
        self.has_budget = bool(memory_budgets)
        # Under a budget, one load at a time: each measures its own growth of the server's memory.
        self.measuring: AbstractAsyncContextManager[object] = (
            asyncio.Lock() if self.has_budget else contextlib.nullcontext()
        )

    def _places(self) -> dict[str, ModelMemory]:
        """Where models take memory under a budget or measured: "host", and "gpu:<id>" each."""
        return {"host": self.memory, **{f"gpu:{gpu}": memory for gpu, memory in self.gpu_memory.items()}}

    def close(self) -> None:
        """Lets go of NVML (the server stops)."""
        if self._gpus is not None:
            self._gpus.close()

    def release(self, key: str) -> None:
        """Forgets an unloaded model's memory in every place."""
        for memory in self._places().values():
            memory.release(key)

    async def _sizes_now(self) -> dict[str, int]:
        """The memory in use now: the server's process tree on the host, each budgeted GPU's."""
        sizes = {"host": await asyncio.to_thread(process_tree_rss)}
        if self._gpus is not None:
            used = await asyncio.to_thread(self._gpus.used)
            sizes.update({f"gpu:{gpu}": size for gpu, size in used.items()})
        return sizes

    async def measured_load(
        self, location: ModelLocation, overrides: LoadOverrides | None, reason: str, served: Model | None
    ) -> Model:
        """`_measured_load`; a refusal of the budget at start-up or in a poll is the model's failure."""
        try:
            return await self._measured_load(location, overrides, reason, served)
        except ModelMemoryBudgetError as exc:
            if reason in ("demand", "explicit"):
                raise
            return Model(location.name, location.path, reason=exc.message, namespace=location.namespace)

    async def _measured_load(
        self, location: ModelLocation, overrides: LoadOverrides | None, reason: str, served: Model | None
    ) -> Model:
        """Loads a model and measures what the server's memory grew by in each place (the
        host, each budgeted GPU); under a budget, unloads the least recently used models to
        make room, before the load where the model's sizes are known from its last load, and
        after it where they are not. Measured, a reload loads every version again: a version
        kept from `served` (`ModelLoader.load`) would leave its size out of the new one's."""
        key = location.key
        places = self._places()
        expected = {place: memory.expected(key) for place, memory in places.items()}
        if self.has_budget:
            await self._make_room(
                location.name, key, {p: size or 0 for p, size in expected.items()}, expected
            )
        logger.info("loading model '%s' from %s", location.name, location.path)
        measuring = self.has_budget or self.on_demand  # only for who asked for them
        before = await self._sizes_now() if measuring else {}
        overrides = overrides or LoadOverrides()
        new = await self._loader.load(location, overrides, served=None if measuring else served)
        if not new.takes_requests:
            return new
        self._retries.pop(location.name, None)  # a failed model's back-off starts anew
        new.loaded_at = time.time()
        if not measuring:
            return new
        try:
            after = await self._sizes_now()
        except CoreserveError:  # a GPU that cannot be read now: the model is not kept unmeasured
            await self._close(new)
            raise
        sizes = {place: max(0, after[place] - before[place]) for place in places}
        new.memory_bytes = sizes["host"]
        new.gpu_memory_bytes = {int(place[4:]): size for place, size in sizes.items() if place != "host"}
        for place, memory in places.items():
            memory.measured(key, sizes[place])
        if self.has_budget:
            try:
                await self._make_room(location.name, key, sizes, expected)
            except ModelMemoryBudgetError:
                await self._close(new)
                raise
        for place, memory in places.items():
            memory.record(key, sizes[place])
        on_gpus = "".join(f", {size} bytes on GPU {gpu}" for gpu, size in new.gpu_memory_bytes.items())
        logger.info("model '%s' uses %d bytes%s (%s)", location.name, new.memory_bytes, on_gpus, reason)
        return new

    async def _make_room(
        self, name: str, key: str, sizes: dict[str, int], expected: dict[str, int | None]
    ) -> None:
        """Unloads models, least recently used first, until the model's `sizes` fit every budget.

        Chooses only models that are loaded, not pinned, not loading, with no request in flight,
        and waits until they are closed; raises ModelMemoryBudgetError, unloading nothing, if
        those are not enough (naming the first place whose budget they leave passed).
        """
        places = self._places()
        if not any(memory.over(sizes[place]) for place, memory in places.items()):
            return
        candidates = sorted(
            (
                (model.last_used(), other)
                for other, model in self._models.items()
                if other != key and self._evictable(other, model)
            ),
            key=lambda pair: pair[0],
        )
        victims, freeing, over = choose_victims(places, sizes, [other for _, other in candidates])
        if over is not None:
            raise places[over].refusal(
                name,
                expected[over],
                "no other loaded model can be unloaded to make room (the others are pinned, loading, "
                "or have requests in flight)"
                if not candidates
                else f"unloading every model that may be unloaded would free only {megabytes(freeing[over])}",
            )
        closing = []
        for other in victims:
            model = self._models[other]
            del self._models[other]
            self.release(other)
            self._unloaded[other] = sorted(model.versions)
            self.lifecycle.evictions += 1
            on_gpus = "".join(
                f", {megabytes(size)} on GPU {gpu}" for gpu, size in model.gpu_memory_bytes.items()
            )
            logger.info(
                "unloading model '%s' (%s%s) to make room for model '%s' within the model memory budget",
                model.name,
                megabytes(model.memory_bytes or 0),
                on_gpus,
                name,
            )
            closing.append(self._close(model))
        # Closed before the load goes on: its measurement must not see their memory go.
        await asyncio.gather(*closing)

    def _evictable(self, key: str, model: Model) -> bool:
        if key in self.pinned or not model.takes_requests or self._lock(key).locked() or model.in_flight():
            return False
        if model.steps():
            return False  # an ensemble: its steps hold the memory
        if not self.on_demand and any(
            model.name in other.steps() for other in self._models.values() if other.takes_requests
        ):
            return False  # nothing would load it again for the ensemble
        return not pinned_by_config(model)

    async def demand(self, name: str, timeout: float | None = None) -> None:
        """Loads a model a request names that is in the repository but not loaded, sharing the
        load with the other requests that wait for it (`timeout`: seconds this one waits).

        Does nothing unless on demand, or for a model held already: loaded, or failed and not yet
        due to be tried again (a request for it then gets the model's error); a request that
        comes while a try is under way waits for it. After it, the model is loaded or held with
        the reason it failed; one not in the repository is not found.
        """
        if not self.on_demand:
            return
        if self._held(name) and not self._demand.running(name) and not self._retry_due(name):
            return
        if self._absent.get(name, 0.0) > time.monotonic():
            return  # looked for a moment ago and not there: the request's lookup says not found
        await self._demand.wait(name, timeout)

    def _retry_due(self, name: str) -> bool:
        """Whether the model is held because its load failed, and may be tried again now."""
        model = self._find(name)
        failed = not model.versions or all(v.state is ModelState.UNAVAILABLE for v in model.versions.values())
        return failed and self._retries.get(name, (0.0, 0.0))[0] <= time.monotonic()

    def _held(self, name: str) -> bool:
        try:
            self._find(name)
        except NotFoundError:
            return False
        return True

    async def _load_on_demand(self, name: str) -> None:
        logger.info("loading model '%s' on demand", name)
        try:
            await self._load(name)
        except ModelMemoryBudgetError:
            raise
        except CoreserveError as exc:
            # A model that failed is held with its reason (requests get the model's error), and
            # tried again after a back-off that doubles with each failure; one not in the
            # repository is not found: an error other than those goes to the requests.
            if self._held(name):
                if len(self._retries) >= MAX_ABSENT_NAMES:
                    self._retries.clear()
                back_off = min(RETRY_MOST_S, 2 * self._retries.get(name, (0.0, RETRY_FIRST_S / 2))[1])
                self._retries[name] = (time.monotonic() + back_off, back_off)
                return
            if isinstance(exc, NotFoundError):  # not looked for again at once: no scan per request
                if len(self._absent) >= MAX_ABSENT_NAMES:
                    self._absent.clear()
                self._absent[name] = time.monotonic() + ABSENT_FOR_S
            raise


def choose_victims(
    places: dict[str, ModelMemory], sizes: dict[str, int], candidates: list[str]
) -> tuple[list[str], dict[str, int], str | None]:
    """The models to unload, from `candidates` (least recently used first), so that a model of
    `sizes` fits every place's budget: each one taken frees memory in a place whose budget is
    still passed (one that frees nothing there stays). Returns them, what they free in each
    place, and the first place whose budget is passed even so (None: every one holds it)."""
    freeing = dict.fromkeys(places, 0)

    def passed() -> str | None:
        for place, memory in places.items():
            budget = memory.budget
            if budget is not None and memory.used() - freeing[place] + sizes[place] > budget:
                return place
        return None

    victims = []
    for other in candidates:
        over = passed()
        if over is None:
            break
        if not places[over].loaded.get(other):
            continue
        victims.append(other)
        for place, memory in places.items():
            freeing[place] += memory.loaded.get(other, 0)
    return victims, freeing, passed()


def pinned_by_config(model: Model) -> bool:
    """Whether the model's configuration pins it (parameter `coreserve_pinned`: true)."""
    if model.config is None:
        return False
    try:
        return bool(bool_parameter(model.config, PINNED_PARAMETER))
    except CoreserveError as exc:  # a value that is not a flag pins nothing, and says so
        logger.warning("%s; the model is not pinned", exc.message)
        return False
