"""The response cache in-process: what its key tells apart, LRU by bytes, owners, statistics."""

from __future__ import annotations

import re
from functools import partial

import ml_dtypes
import numpy as np
import pytest

from coreserve.scheduling.cache.config import CacheConfigError, check_cache_config, make_response_cache
from coreserve.scheduling.cache.key import model_prefix, request_key
from coreserve.scheduling.cache.responses import (
    ENTRY_OVERHEAD,
    OUTPUT_OVERHEAD,
    CachedResponse,
    LocalResponseCache,
)
from coreserve.types import InferenceRequest, InferenceResponse

PREFIX = model_prefix("m", 1, 1)


def _key(prefix: bytes = PREFIX, *, exact_up_to: int = 0, **fields: object) -> bytes:
    inputs = fields.pop("inputs", {"X": np.arange(6, dtype=np.float32).reshape(2, 3)})
    request = InferenceRequest("m", inputs, **fields)  # type: ignore[arg-type]
    return request_key(prefix, request, exact_up_to=exact_up_to)


def _entry(nbytes: int) -> CachedResponse:
    return CachedResponse({}, {}, nbytes)


@pytest.mark.parametrize("exact_up_to", [0, 256], ids=["hashed", "exact"])
def test_the_key_tells_apart_what_changes_an_answer(exact_up_to: int) -> None:
    key = partial(_key, exact_up_to=exact_up_to)
    base = np.arange(6, dtype=np.float32)
    same = key(inputs={"X": base.reshape(2, 3)})
    assert same == key()
    others = [
        key(inputs={"X": base.reshape(3, 2)}),  # shape
        key(inputs={"X": base.view(np.int32).reshape(2, 3)}),  # datatype, same bytes
        key(inputs={"Y": base.reshape(2, 3)}),  # name
        key(inputs={"X": (base + 1).reshape(2, 3)}),  # bytes
        key(inputs={"S": np.array([b"ab", b"c"], dtype=np.object_)}),
        key(inputs={"S": np.array([b"a", b"bc"], dtype=np.object_)}),  # element boundaries
        key(requested_outputs=("A",)),
        key(requested_outputs=("A", "B")),
        key(parameters={"offset": 1}),
        key(parameters={"offset": True}),
        key(model_prefix("m", 2, 1)),  # another version
        key(model_prefix("m", 1, 2)),  # another load of the same version
        key(model_prefix("n", 1, 1)),
    ]
    assert len({same, *others}) == len(others) + 1


def test_small_inputs_make_a_key_of_their_bytes_and_large_ones_a_hash() -> None:
    small = np.arange(4, dtype=np.float32)  # 16 bytes
    exact = _key(inputs={"X": small}, exact_up_to=16)
    assert small.tobytes() in exact and exact.startswith(PREFIX)
    assert _key(inputs={"X": small.T}, exact_up_to=16) == exact  # the bytes in C order
    # Past the limit (here across two inputs), the same material is hashed: a 16-byte key,
    # the one a hashed key of the same request has.
    two = {"X": small, "Y": small}
    assert _key(inputs=two, exact_up_to=16) == _key(inputs=two) and len(_key(inputs=two)) == 16
    strided = np.arange(12, dtype=np.float32)[::-2].reshape(2, 3)
    assert _key(inputs={"X": strided}, exact_up_to=16) == _key(inputs={"X": strided.copy()})
    assert _key(inputs={}, exact_up_to=0) != PREFIX  # 0 means never, even for no input bytes


def test_a_long_key_counts_against_the_size() -> None:
    cache = LocalResponseCache(300)
    assert cache.insert(b"k" * 116, 1, _entry(200))  # 100 bytes beyond a 16-byte hash: 300 in all
    assert cache.statistics().used_bytes == 300
    assert not cache.insert(b"k" * 117, 1, _entry(200))  # 301: more than the cache
    assert cache.lookup(b"k" * 116) is not None


def test_the_key_ignores_layout_input_order_and_scheduling_parameters() -> None:
    array = np.arange(6, dtype=np.float32).reshape(3, 2)
    assert _key(inputs={"X": array.T}) == _key(inputs={"X": np.ascontiguousarray(array.T)})
    a, b = np.ones(2, np.float32), np.zeros(2, np.float32)
    assert _key(inputs={"A": a, "B": b}) == _key(inputs={"B": b, "A": a})
    assert _key(parameters={"priority": 2, "timeout": 5}) == _key()
    strided = np.arange(12, dtype=np.float32)[::-2].reshape(2, 3)  # hashed as its bytes in C order
    assert _key(inputs={"X": strided}) == _key(inputs={"X": strided.copy()})
    assert _key(inputs={"X": strided}) != _key()


def test_bytes_elements_keep_their_boundaries_and_bf16_hashes() -> None:
    first = _key(inputs={"S": np.array([b"ab", b"c"], dtype=np.object_)})
    second = _key(inputs={"S": np.array([b"a", b"bc"], dtype=np.object_)})
    assert first != second
    bf16 = np.ones((2, 2), dtype=ml_dtypes.bfloat16)
    assert _key(inputs={"X": bf16.T}) == _key(inputs={"X": bf16})
    assert _key(inputs={"X": bf16}) != _key(inputs={"X": np.ones((2, 2), np.float16)})


def test_least_recently_used_goes_first_and_an_entry_never_exceeds_the_cache() -> None:
    cache = LocalResponseCache(300)
    for key in (b"a", b"b", b"c"):
        assert cache.insert(key, 1, _entry(100))
    assert cache.lookup(b"a") is not None  # a is now the most recently used
    assert cache.insert(b"d", 1, _entry(100))
    assert cache.lookup(b"b") is None  # evicted: used least recently
    assert [cache.lookup(k) is not None for k in (b"a", b"c", b"d")] == [True, True, True]
    assert not cache.insert(b"huge", 1, _entry(301))
    assert cache.statistics().entries == 3  # nothing was evicted for it
    assert cache.insert(b"whole", 1, _entry(300))  # exactly the size: fits, alone
    stats = cache.statistics()
    assert (stats.entries, stats.used_bytes, stats.evictions, stats.utilization) == (1, 300, 4, 1.0)


def test_evicting_an_owner_removes_only_its_entries() -> None:
    cache = LocalResponseCache(1000)
    cache.insert(b"a", 1, _entry(100))
    cache.insert(b"b", 2, _entry(100))
    cache.insert(b"c", 1, _entry(100))
    assert cache.evict_owner(1) == 2
    stats = cache.statistics()
    assert (stats.entries, stats.used_bytes) == (1, 100)
    assert cache.lookup(b"b") is not None and cache.lookup(b"a") is None
    assert (stats.lookups, stats.hits, stats.misses) == (0, 0, 0)  # a copy, taken before the lookups
    after = cache.statistics()
    assert (after.lookups, after.hits, after.misses) == (2, 1, 1)


def test_a_cached_response_is_a_private_read_only_copy() -> None:
    output = np.arange(4, dtype=np.float32)
    cached = CachedResponse.of(InferenceResponse("m", "1", {"OUT": output}, parameters={"p": 1}))
    output[0] = 99  # the backend reuses its buffer
    assert cached.outputs["OUT"][0] == 0
    assert not cached.outputs["OUT"].flags.writeable
    assert cached.nbytes == ENTRY_OVERHEAD + OUTPUT_OVERHEAD + 16
    words = CachedResponse.of(InferenceResponse("m", "1", {"W": np.array([b"abc"], dtype=np.object_)}))
    assert words.nbytes == ENTRY_OVERHEAD + OUTPUT_OVERHEAD + 3 + 4


@pytest.mark.parametrize(
    "output",
    [
        np.arange(12, dtype=np.int64).reshape(3, 4).T,  # not C-contiguous
        np.zeros((0, 3), dtype=np.float32),
        np.array(7.5, dtype=np.float64),
        np.arange(4, dtype=ml_dtypes.bfloat16).reshape(2, 2),
        np.array([True, False]),
    ],
)
def test_a_cached_output_keeps_values_shape_and_datatype_read_only(output: np.ndarray) -> None:
    stored = CachedResponse.of(InferenceResponse("m", "1", {"OUT": output})).outputs["OUT"]
    assert (stored.dtype, stored.shape) == (output.dtype, output.shape)
    assert stored.tobytes() == output.tobytes() and stored.flags.c_contiguous
    assert not stored.flags.writeable
    with pytest.raises(ValueError) as refused:
        stored[...] = 0
    assert "read-only" in str(refused.value)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"local": {"size": "x"}}, "size must be a whole number of bytes above 0, got 'x'"),
        ({"local": {"size": "1e6"}}, "got '1e6'"),
        ({"local": {}}, "needs size=BYTES"),
        ({"local": {"size": "5", "ttl": "3"}}, "unknown setting 'ttl'"),
        ({"disk": {"size": "5"}}, "unknown cache 'disk'"),
        ({"local": {"size": "5"}, "redis": {"host": "h"}}, "found multiple cache configurations"),
    ],
)
def test_cache_configs_that_make_no_cache_are_refused(
    config: dict[str, dict[str, str]], message: str
) -> None:
    with pytest.raises(CacheConfigError, match=message):
        check_cache_config(config)


def test_a_local_config_makes_a_local_cache_and_redis_needs_an_address() -> None:
    cache = make_response_cache({"local": {"size": "4096"}})
    assert isinstance(cache, LocalResponseCache) and cache.size == 4096
    assert make_response_cache({}) is None
    assert check_cache_config({"redis": {"host": "localhost", "port": "6379", "db": "2"}}) is None
    with pytest.raises(CacheConfigError, match="didn't specify address"):  # Triton's words
        check_cache_config({"redis": {"host": "localhost"}})
    with pytest.raises(CacheConfigError, match=re.escape("socket_timeout must be a whole number, got '1.5'")):
        check_cache_config({"redis": {"host": "h", "port": "1", "socket_timeout": "1.5"}})


def test_a_hit_counts_as_a_success_and_in_the_request_summary_not_as_an_execution() -> None:
    from coreserve.scheduling.statistics import LatencyOptions, ModelStatistics

    statistics = ModelStatistics("m", 1, LatencyOptions(summaries=True, histograms=True))
    request = InferenceRequest("m", {}, received_ns=1_000)
    request.queued_ns = 2_000
    statistics.record_cache_hit(request, lookup_start_ns=3_000, end_ns=11_000)
    inference = statistics.as_dict()["inference_stats"]
    assert inference["success"] == {"count": 1, "ns": 10_000}
    assert inference["queue"] == {"count": 1, "ns": 1_000}
    assert inference["cache_hit"] == {"count": 1, "ns": 8_000}
    assert inference["compute_infer"] == {"count": 0, "ns": 0}
    assert (statistics.inference_count, statistics.execution_count) == (0, 0)
    assert statistics.quantiles("request", [0.5], 11_000) == [10.0]  # µs
    assert statistics.quantiles("queue", [0.5], 11_000) == [1.0]
    assert np.isnan(statistics.quantiles("compute_infer", [0.5], 11_000)[0])  # hits are not computed
    assert sum(statistics.histograms["request"]) == 1
    statistics.record_cache_miss(500)
    assert statistics.as_dict()["inference_stats"]["cache_miss"] == {"count": 1, "ns": 500}
