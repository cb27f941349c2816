"""`--cache-config <cache>,<key>=<value>`: which response cache a server has, checked at start-up.

Triton's flag and keys: `--cache-config local,size=BYTES` makes a cache of BYTES in this
process; `--cache-config redis,host=H --cache-config redis,port=P` (and Triton's other redis
settings) one in a Redis server that several processes share (see `_redis`). Every mistake
is refused before the server starts, in one line.
"""

from __future__ import annotations

from collections.abc import Mapping

from coreserve.scheduling.cache._redis import RedisResponseCache, redis_settings_problem
from coreserve.scheduling.cache.responses import LocalResponseCache, ResponseCache

# The settings each cache takes.
LOCAL_KEYS = ("size",)


class CacheConfigError(ValueError):
    """A --cache-config that cannot make a cache; the message says why, in one line."""


def parse_cache_setting(text: str) -> tuple[str, str, str]:
    """One `--cache-config` value as (cache, key, value)."""
    cache, _, setting = text.partition(",")
    key, equals, value = setting.partition("=")
    if not cache or not key or not equals:
        raise CacheConfigError(f"expected <cache>,<key>=<value> (e.g. local,size=1048576), got '{text}'")
    return cache, key, value


def check_cache_config(config: Mapping[str, Mapping[str, str]]) -> str | None:
    """Raises CacheConfigError for a config no cache can be made of; returns a warning to log
    for one that is made but may not act as asked (none yet), else None."""
    if len(config) > 1:  # Triton's words
        raise CacheConfigError(
            "found multiple cache configurations, but only a single cache is currently supported"
        )
    for name, settings in config.items():
        if name == "redis":
            problem = redis_settings_problem(settings)
            if problem is not None:
                raise CacheConfigError(problem)
            continue
        if name != "local":
            raise CacheConfigError(
                f"--cache-config: unknown cache '{name}' (coreserve has 'local' and 'redis')"
            )
        unknown = sorted(set(settings) - set(LOCAL_KEYS))
        if unknown:
            raise CacheConfigError(
                f"--cache-config local: unknown setting '{unknown[0]}' (the local cache takes size=BYTES)"
            )
        if "size" not in settings:
            raise CacheConfigError("--cache-config local: needs size=BYTES (e.g. local,size=1048576)")
        local_size(settings)
    return None


def local_size(settings: Mapping[str, str]) -> int:
    """The local cache's size in bytes: a whole number above 0."""
    text = settings["size"]
    try:
        size = int(text)
    except ValueError:
        size = -1
    if size <= 0 or not text.strip().isdigit():
        raise CacheConfigError(
            f"--cache-config local: size must be a whole number of bytes above 0, got '{text}'"
        )
    return size


def make_response_cache(config: Mapping[str, Mapping[str, str]]) -> ResponseCache | None:
    """The cache `config` asks for, or None (no --cache-config)."""
    check_cache_config(config)
    if "redis" in config:
        return RedisResponseCache(config["redis"])
    settings = config.get("local")
    return LocalResponseCache(local_size(settings)) if settings is not None else None
