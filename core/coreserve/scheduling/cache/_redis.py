"""`--cache-config redis,host=H --cache-config redis,port=P`: responses kept in a Redis server.

Triton's `redis` cache and its settings (host, port, user, password, db, connect_timeout and
socket_timeout in milliseconds). Every coreserve process that names the same Redis server
shares its entries: a response one process computed answers the same request to another.
So that keys agree across processes, a model version's keys carry a fingerprint of its files
(`key.version_fingerprint`) instead of the per-process load number the local cache uses; changed
files make new keys, so an answer of other files is never returned. Entries are Redis hashes,
one field per output part (the request's 128-bit key, hex, is the Redis key); Redis bounds and
evicts them as it is configured to (`maxmemory`, `maxmemory-policy`). A version that unloads
deletes the entries this process filed for it.

Needs the `redis` package (`pip install core-server[redis]`); imported only when asked for.
Lookups, inserts and deletions run on one thread of the cache's own (its `executor`), in the
order they were asked for, so a slow Redis delays the requests that wait for its answer and no
others; `socket_timeout` bounds how long. A Redis that cannot be reached makes lookups miss
(logged once per outage), never fails a request. The statistics a metrics scrape reads
(entries, memory) are two calls made on the same thread (`MetricsReport.render_on_loop`), so a
slow Redis holds up the scrape, not the event loop.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import json
import logging
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import numpy as np

from coreserve.errors import CoreserveError
from coreserve.protocol.bytes_codec import decode_bytes_tensor, encode_bytes_tensor
from coreserve.scheduling.cache.responses import CachedResponse, CacheStatistics
from coreserve.types import now_ns

logger = logging.getLogger(__name__)

# Triton's settings of its redis cache; host and port are required.
REDIS_KEYS = ("host", "port", "user", "password", "db", "connect_timeout", "socket_timeout")
ADDRESS_NEEDED = (
    "Failed to initialize RedisCache, didn't specify address. Must at a minimum specify 'host' and "
    "'port' in the configuration - e.g. tritonserver --cache-config redis,host=redis --cache-config "
    "redis,port=6379 --model-repository=/models ..."
)
_NUMBERS = ("port", "db", "connect_timeout", "socket_timeout")


def redis_settings_problem(settings: Mapping[str, str]) -> str | None:
    """Why `settings` cannot make a Redis cache, in one line, or None."""
    if importlib.util.find_spec("redis") is None:
        return "--cache-config redis needs the redis package: pip install core-server[redis]"
    unknown = sorted(set(settings) - set(REDIS_KEYS))
    if unknown:
        return f"--cache-config redis: unknown setting '{unknown[0]}' (it takes {', '.join(REDIS_KEYS)})"
    if "host" not in settings or "port" not in settings:
        return ADDRESS_NEEDED
    for key in _NUMBERS:
        text = settings.get(key)
        if text is not None and not text.strip().isdigit():
            return f"--cache-config redis: {key} must be a whole number, got '{text}'"
    return None


class RedisResponseCache:
    """Entries in a Redis server, shared with the other processes that use it."""

    name = "redis"
    shared = True  # keys must agree across processes (see version_fingerprint)

    def __init__(self, settings: Mapping[str, str]) -> None:
        import redis  # present: redis_settings_problem checked it

        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        timeouts = ("connect_timeout", "socket_timeout")
        seconds = {key: int(settings[key]) / 1000 for key in timeouts if key in settings}
        self.address = f"{settings['host']}:{settings['port']}"
        self._client = redis.Redis(
            host=settings["host"],
            port=int(settings["port"]),
            db=int(settings.get("db", "0")),
            username=settings.get("user"),
            password=settings.get("password"),
            socket_connect_timeout=seconds.get("connect_timeout", 1.0),
            socket_timeout=seconds.get("socket_timeout", 1.0),
        )
        # One thread: an unload's deletion runs after the inserts asked for before it.
        self.executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="redis-cache")
        self._owned: defaultdict[int, set[bytes]] = defaultdict(set)  # touched on the executor only
        self._stats = CacheStatistics()
        self._failing = False
        try:
            self._client.ping()
        except self._errors as exc:
            self._report(exc)

    def lookup(self, key: bytes) -> CachedResponse | None:
        started = now_ns()
        stats = self._stats
        stats.lookups += 1
        try:
            fields: dict[Any, Any] = self._client.hgetall(key.hex())
        except self._errors as exc:
            self._report(exc)
            fields = {}
        found = _decode(fields) if fields else None
        if found is None:
            stats.misses += 1
        else:
            stats.hits += 1
            self._recovered()
        stats.lookup_ns += now_ns() - started
        return found

    def insert(self, key: bytes, owner: int, entry: CachedResponse) -> bool:
        started = now_ns()
        try:
            fields: dict[Any, Any] = _encode(entry)
            self._client.hset(key.hex(), mapping=fields)
        except self._errors as exc:
            self._report(exc)
            return False
        self._recovered()
        self._owned[owner].add(key)
        self._stats.insertion_ns += now_ns() - started
        return True

    def evict_owner(self, owner: int) -> int:
        keys = self._owned.pop(owner, set())
        if not keys:
            return 0
        try:
            return int(self._client.delete(*(key.hex() for key in keys)))
        except self._errors as exc:
            self._report(exc)
            return 0

    def statistics(self) -> CacheStatistics:
        """This process's lookups; the entries and memory of the whole Redis database."""
        stats = self._stats
        entries = used = size = 0
        try:
            entries = int(self._client.dbsize())
            memory: dict[str, Any] = self._client.info("memory")
            used, size = int(memory.get("used_memory", 0)), int(memory.get("maxmemory", 0))
        except self._errors as exc:
            self._report(exc)
        return CacheStatistics(
            entries=entries,
            lookups=stats.lookups,
            hits=stats.hits,
            misses=stats.misses,
            lookup_ns=stats.lookup_ns,
            insertion_ns=stats.insertion_ns,
            used_bytes=used if size else 0,
            size_bytes=size,
        )

    def _report(self, exc: BaseException) -> None:
        if not self._failing:  # once per outage: a log line per request would flood the log
            self._failing = True
            logger.warning(
                "redis cache at %s is not answering (%s); requests miss until it does", self.address, exc
            )

    def _recovered(self) -> None:
        if self._failing:
            self._failing = False
            logger.info("redis cache at %s answers again", self.address)


def _encode(entry: CachedResponse) -> dict[str, bytes]:
    """A response as the fields of a Redis hash: per output its name, datatype, shape and data."""
    fields: dict[str, bytes] = {"parameters": json.dumps(dict(entry.parameters)).encode()}
    for index, (name, array) in enumerate(entry.outputs.items()):
        fields[f"{index}:name"] = name.encode()
        fields[f"{index}:dtype"] = b"BYTES" if array.dtype.kind == "O" else array.dtype.str.encode()
        fields[f"{index}:shape"] = json.dumps(list(array.shape)).encode()
        fields[f"{index}:data"] = encode_bytes_tensor(array) if array.dtype.kind == "O" else array.tobytes()
    return fields


def _decode(fields: Mapping[bytes, bytes]) -> CachedResponse | None:
    """The response a Redis hash holds; None for one that is not an entry of ours."""
    try:
        outputs: dict[str, np.ndarray] = {}
        nbytes = 0
        for index in range((len(fields) - 1) // 4):
            name = fields[f"{index}:name".encode()].decode()
            shape = tuple(json.loads(fields[f"{index}:shape".encode()]))
            dtype = fields[f"{index}:dtype".encode()]
            data = fields[f"{index}:data".encode()]
            if dtype == b"BYTES":
                array = decode_bytes_tensor(data, None, name).reshape(shape)
            else:
                array = np.frombuffer(data, dtype=np.dtype(dtype.decode())).reshape(shape)
            array.flags.writeable = False
            outputs[name] = array
            nbytes += len(data)
        parameters = json.loads(fields[b"parameters"])
    except (KeyError, ValueError, TypeError, CoreserveError) as exc:
        logger.warning("redis cache: an entry that is not a coreserve response was ignored (%s)", exc)
        return None
    return CachedResponse(outputs, parameters, nbytes)
