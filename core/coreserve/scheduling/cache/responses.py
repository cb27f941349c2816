"""The response cache: answers a request seen before without running the model again.

Two layers, as Triton has them. A `ResponseCache` (`--cache-config`) holds entries for every
model of the server, bounded in bytes; `LocalResponseCache` keeps them in this process and
evicts the least recently used. A `ModelResponseCache` is what one loaded model version with
`response_cache { enable: true }` puts in front of its scheduler: it looks a request up before
it queues (a hit is answered at once, and the backend never sees it), files the successful
response of a miss, and records the hit and miss statistics of the model.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple, Protocol

import numpy as np

from coreserve.errors import CoreserveError
from coreserve.responses import ForwardingSink
from coreserve.scheduling.cache.key import DIGEST_SIZE, model_prefix, request_key
from coreserve.scheduling.statistics import ModelStatistics
from coreserve.types import InferenceRequest, InferenceResponse, ParameterValue, ResponseSink, now_ns

# What an entry holds beyond its tensor bytes, so that the size bounds the memory the cache
# really holds (measured with sys.getsizeof on CPython 3.11): the key, the LRU order's node,
# the tuples and mappings (about 512 bytes), and each output's array object (112 bytes).
ENTRY_OVERHEAD = 512
OUTPUT_OVERHEAD = 112
# Inputs of at most this many bytes make a key of their own bytes, not a hash (see request_key):
# a local cache counts what such a key holds beyond a hash's 16 bytes against its size.
EXACT_KEY_BYTES = 256
_generations = itertools.count(1)
logger = logging.getLogger(__name__)


class CachedResponse(NamedTuple):
    """The outputs and parameters of one response, read-only, and what they count against the size."""

    outputs: Mapping[str, np.ndarray]
    parameters: Mapping[str, ParameterValue]
    nbytes: int

    @classmethod
    def of(cls, response: InferenceResponse) -> CachedResponse:
        """A private, read-only copy of a response's outputs (a backend may reuse its buffers)."""
        outputs: dict[str, np.ndarray] = {}
        nbytes = ENTRY_OVERHEAD
        for name, array in response.outputs.items():
            if array.dtype.kind == "O":
                stored = array.copy()
                stored.flags.writeable = False
                nbytes += OUTPUT_OVERHEAD + _object_bytes(stored)
            else:
                # Handed to every hit, so read-only: an array over immutable bytes is born so,
                # at half the cost of a copy made read-only afterwards (flags.writeable).
                stored = np.ndarray(array.shape, array.dtype, array.tobytes())
                nbytes += OUTPUT_OVERHEAD + stored.nbytes
            outputs[name] = stored
        return cls(outputs, dict(response.parameters), nbytes)


def _object_bytes(array: np.ndarray) -> int:
    """What a BYTES tensor counts: each element's bytes and its 4-byte length, as the wire carries them."""
    return sum(len(element) + 4 if isinstance(element, bytes) else 8 for element in array.reshape(-1))


@dataclass(slots=True)
class CacheStatistics:
    """Cache-wide counts and durations: Triton's nv_cache_* families."""

    entries: int = 0
    lookups: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    lookup_ns: int = 0
    insertion_ns: int = 0
    used_bytes: int = 0
    size_bytes: int = 0

    @property
    def utilization(self) -> float:
        """The fraction of the size that entries hold, from 0.0 to 1.0."""
        return self.used_bytes / self.size_bytes if self.size_bytes else 0.0


class ResponseCache(Protocol):
    """A store of responses by key, shared by the models of a server (`--cache-config`).

    Called on the event loop thread, unless it names an `executor`: then lookup, insert and
    evict_owner run on that (one-thread) executor, in the order they were asked for, and the
    event loop never waits for the store.
    """

    name: str  # the --cache-config implementation name ("local")
    # True when other processes read the same entries: keys then name a model version by a
    # fingerprint of its files, not by this process's load number.
    shared: bool

    @property
    def executor(self) -> concurrent.futures.Executor | None:
        """Where calls that wait on another process (a Redis server) run; None: on the event loop."""
        ...

    def lookup(self, key: bytes) -> CachedResponse | None:
        """The response filed under `key`, or None; a hit makes the entry most recently used."""
        ...

    def insert(self, key: bytes, owner: int, entry: CachedResponse) -> bool:
        """Files `entry` under `key` for `owner` (a loaded model version); False if it cannot
        hold it (larger than the whole cache)."""
        ...

    def evict_owner(self, owner: int) -> int:
        """Removes every entry of `owner` (a model version unloading); returns how many."""
        ...

    def statistics(self) -> CacheStatistics:
        """The counts and durations so far."""
        ...


class LocalResponseCache:
    """Entries in this process's memory, at most `size` bytes, least recently used evicted first."""

    name = "local"
    shared = False
    executor = None

    def __init__(self, size: int) -> None:
        if size <= 0:
            raise ValueError(f"a cache size must be above 0 bytes, got {size}")
        self.size = size
        # key -> (owner, entry, the bytes it counts: the entry's and a long key's)
        self._entries: OrderedDict[bytes, tuple[int, CachedResponse, int]] = OrderedDict()
        self._stats = CacheStatistics(size_bytes=size)

    def lookup(self, key: bytes) -> CachedResponse | None:
        started = now_ns()
        stats = self._stats
        stats.lookups += 1
        found = self._entries.get(key)
        if found is None:
            stats.misses += 1
            stats.lookup_ns += now_ns() - started
            return None
        self._entries.move_to_end(key)
        stats.hits += 1
        stats.lookup_ns += now_ns() - started
        return found[1]

    def insert(self, key: bytes, owner: int, entry: CachedResponse) -> bool:
        cost = entry.nbytes + max(0, len(key) - DIGEST_SIZE)
        if cost > self.size:  # it would evict everything, then not fit (logged as Triton logs it)
            logger.error(
                "Failed to insert key [%s] into response cache: Requested byte_size: %d is greater than "
                "total cache size: %d",
                key.hex(),
                cost,
                self.size,
            )
            return False
        started = now_ns()
        stats = self._stats
        entries = self._entries
        previous = entries.pop(key, None)
        if previous is not None:  # two misses of the same request raced; keep the newer answer
            stats.used_bytes -= previous[2]
        used = stats.used_bytes + cost
        while used > self.size:
            used -= entries.popitem(last=False)[1][2]  # the least recently used
            stats.evictions += 1
        entries[key] = (owner, entry, cost)
        stats.used_bytes = used
        stats.insertion_ns += now_ns() - started
        return True

    def evict_owner(self, owner: int) -> int:
        # A scan: unloads are rare, and no per-owner index then costs each insert and eviction.
        keys = [key for key, (holder, _, _) in self._entries.items() if holder == owner]
        for key in keys:
            self._stats.used_bytes -= self._entries.pop(key)[2]
        return len(keys)

    def statistics(self) -> CacheStatistics:
        stats = self._stats
        return CacheStatistics(
            entries=len(self._entries),
            lookups=stats.lookups,
            hits=stats.hits,
            misses=stats.misses,
            evictions=stats.evictions,
            lookup_ns=stats.lookup_ns,
            insertion_ns=stats.insertion_ns,
            used_bytes=stats.used_bytes,
            size_bytes=stats.size_bytes,
        )


class ModelResponseCache:
    """The cache in front of one loaded model version's scheduler."""

    __slots__ = ("_exact_up_to", "_headers", "cache", "closed", "model_version", "owner", "prefix")

    def __init__(self, cache: ResponseCache, model_name: str, version: int, fingerprint: str = "") -> None:
        """`fingerprint`: what names this version's files in a shared cache (see `_redis`)."""
        self.cache = cache
        self.model_version = str(version)
        # Each load is a new owner with its own keys: a reloaded model never finds the answers
        # of the files it replaced, even before those are evicted. In a shared cache the
        # fingerprint of the files does that, and keys agree across processes.
        self.owner = next(_generations)
        self.prefix = model_prefix(model_name, version, fingerprint or self.owner)
        self.closed = False
        self._headers: dict[object, bytes] = {}  # see request_key
        # A shared cache's keys name entries in another store: always a hash, of one length.
        self._exact_up_to = 0 if cache.shared else EXACT_KEY_BYTES

    def answer(
        self,
        request: InferenceRequest,
        statistics: ModelStatistics,
        admit: Callable[[InferenceRequest], None],
    ) -> bool:
        """Answers `request` from the cache (True), or arranges for its response to be filed.

        With a cache that runs on an executor, the lookup runs there and this returns True at
        once: a hit is answered when it comes back, a miss handed to `admit` (the scheduler's
        queue) then.
        """
        started = now_ns()
        key = request_key(self.prefix, request, self._headers, self._exact_up_to)
        cache = self.cache
        if cache.executor is not None:
            looking = asyncio.get_running_loop().run_in_executor(cache.executor, cache.lookup, key)
            looking.add_done_callback(partial(self._looked_up, request, key, started, statistics, admit))
            return True
        found = cache.lookup(key)
        if found is None:
            self._missed(request, key, started, statistics)
            return False
        # Delivered at the loop's next turn, not from inside the callback that read the
        # request: a frontend then writes the answers of the requests read in one turn
        # together, and a waiting client is woken once for them, not once per answer. The
        # wake-ups cost the server more than a hit saves (benchmarks/features/response_cache.py measures
        # hits against the cache off; docs/benchmarks.md has the figures).
        asyncio.get_running_loop().call_soon(self._hit, request, found, started, statistics)
        return True

    def _looked_up(
        self,
        request: InferenceRequest,
        key: bytes,
        started: int,
        statistics: ModelStatistics,
        admit: Callable[[InferenceRequest], None],
        done: asyncio.Future[CachedResponse | None],
    ) -> None:
        """A lookup on the executor came back: answer the hit, or queue the miss."""
        try:
            found = done.result()
        except Exception:  # a fault of the store's client: the request runs as if it missed
            logger.exception("response cache '%s': a lookup failed", self.cache.name)
            found = None
        if found is not None:
            self._hit(request, found, started, statistics)
            return
        self._missed(request, key, started, statistics)
        admit(request)

    def _hit(
        self, request: InferenceRequest, found: CachedResponse, started: int, statistics: ModelStatistics
    ) -> None:
        sink = request.sink
        assert sink is not None
        response = InferenceResponse(
            model_name=request.model_name,
            model_version=self.model_version,
            outputs=dict(found.outputs),  # its own mapping: a sink may replace outputs in it
            id=request.id,
            parameters=dict(found.parameters),
        )
        statistics.record_cache_hit(request, started, now_ns())
        sink.send(response, True)

    def _missed(
        self, request: InferenceRequest, key: bytes, started: int, statistics: ModelStatistics
    ) -> None:
        """Its response will be filed under `key` when it comes."""
        sink = request.sink
        assert sink is not None
        request.sink = CachingSink(sink, self, key, statistics, now_ns() - started)

    def file(self, key: bytes, response: InferenceResponse) -> asyncio.Future[bool] | None:
        """Files the response of a miss (not once the version is unloading: it would linger).

        Returns the insert running on the cache's executor, if it has one; None when done.
        """
        if self.closed:
            return None
        cache, entry = self.cache, CachedResponse.of(response)  # copied here: a backend may reuse its buffers
        if cache.executor is None:
            cache.insert(key, self.owner, entry)
            return None
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(cache.executor, cache.insert, key, self.owner, entry)

    def close(self) -> None:
        """Drops this version's entries; called when it unloads or is replaced."""
        self.closed = True
        cache = self.cache
        if cache.executor is None:
            cache.evict_owner(self.owner)
        else:  # after the inserts already asked for: the executor keeps their order
            cache.executor.submit(cache.evict_owner, self.owner)


class CachingSink(ForwardingSink):
    """A missed request's sink: files its successful response, then passes everything on."""

    __slots__ = ("_cache", "_key", "_lookup_ns", "_statistics")

    def __init__(
        self,
        target: ResponseSink,
        cache: ModelResponseCache,
        key: bytes,
        statistics: ModelStatistics,
        lookup_ns: int,
    ) -> None:
        super().__init__(target)
        self._cache = cache
        self._key = key
        self._statistics = statistics
        self._lookup_ns = lookup_ns

    def send(self, response: InferenceResponse | None, final: bool) -> None:
        if response is not None and final and not self._target.done:
            started = now_ns()
            filing = self._cache.file(self._key, response)
            self._statistics.record_cache_miss(self._lookup_ns + now_ns() - started)
            if filing is not None:  # answered once filed: then the next asker finds it
                filing.add_done_callback(partial(self._filed, response))
                return
        self._target.send(response, final)

    def _filed(self, response: InferenceResponse, filing: asyncio.Future[bool]) -> None:
        # An exception is a fault of the store's client: the answer goes out all the same.
        if not filing.cancelled() and (exc := filing.exception()) is not None:
            logger.error("response cache '%s': an insert failed: %r", self._cache.cache.name, exc)
        self._target.send(response, True)

    def fail(self, error: CoreserveError) -> None:
        if not self._target.done:
            self._statistics.record_cache_miss(self._lookup_ns)
        self._target.fail(error)
