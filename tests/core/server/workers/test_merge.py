"""The worker merges: one server's statistics and metrics from each worker's own.

The real inputs come from one in-process server over two ONNX models (one behind the local
response cache), with latency summaries and histograms on: its statistics (GET
/v2/models/stats) and its /metrics text after a first round of requests, and again after a
second round with another batch size. The two answers stand for two workers' answers; each
merged value is checked against the inputs, read back with prometheus-client's own parser.
Small hand-written answers and texts cover the rules real answers do not reach here.
"""

from __future__ import annotations

import json
import math
import re
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

import coreserve
from coreserve.server.metrics._system_metrics import GPU_FAMILIES
from coreserve.server.workers._merge import (
    TAKEN_ONCE,
    merge_metrics,
    merge_statistics,
    without_model_metrics,
    without_model_statistics,
)
from support.model_builders import ADD_SUB_CONFIG, add_sub_model, write_model

CACHED = ADD_SUB_CONFIG + "response_cache { enable: true }\n"
# The families of a CPU-only scrape that describe the machine or the process kind: not summed.
MACHINE = {
    "nv_cpu_utilization",
    "nv_cpu_memory_total_bytes",
    "nv_cpu_memory_used_bytes",
    "process_max_fds",
    "process_start_time_seconds",
    "python_info",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[coreserve.Server]:
    root = tmp_path_factory.mktemp("merge-models")
    write_model(root, "plain", add_sub_model(), ADD_SUB_CONFIG)
    write_model(root, "cached", add_sub_model(), CACHED)
    settings: dict[str, Any] = {
        "http_address": "127.0.0.1",
        "http_port": 0,
        "metrics_address": "127.0.0.1",
        "metrics_port": 0,
        "summary_latencies": True,
        "histogram_latencies": True,
        "summary_quantiles": (0.5, 0.9),
        "cache_config": {"local": {"size": "1048576"}},
        "allow_gpu_metrics": False,
    }
    with coreserve.Server(root, frontends=["http", "metrics"], **settings) as running:
        yield running


def infer(server: coreserve.Server, model: str, rows: int, fill: float = 1.0) -> None:
    inputs = {name: np.full((rows, 4), fill, np.float32) for name in ("INPUT0", "INPUT1")}
    server.model(model).infer(inputs)


def get(server: coreserve.Server, frontend: str, path: str) -> str:
    url = f"http://127.0.0.1:{server.ports[frontend]}{path}"
    with urllib.request.urlopen(url, timeout=30) as answer:
        return str(answer.read().decode())


@pytest.fixture(scope="module")
def two_answers(server: coreserve.Server) -> list[tuple[dict[str, Any], str]]:
    """(statistics, metrics text) after a first round of requests, and after a second."""
    found = []
    for round_ in (
        [("plain", 1, 1.0), ("plain", 2, 1.0), ("cached", 1, 1.0), ("cached", 1, 1.0)],
        [("plain", 3, 1.0), ("plain", 1, 2.0), ("cached", 2, 5.0), ("cached", 2, 5.0), ("cached", 1, 1.0)],
    ):
        for model, rows, fill in round_:
            infer(server, model, rows, fill)
        found.append(
            (json.loads(get(server, "http", "/v2/models/stats")), get(server, "metrics", "/metrics"))
        )
    return found


# Statistics from a real server ------------------------------------------------------------


def test_merged_statistics_sum_every_count_of_real_answers(
    two_answers: list[tuple[dict[str, Any], str]],
) -> None:
    (first, _), (second, _) = two_answers
    merged = merge_statistics([first, second])

    assert [m["name"] for m in merged["model_stats"]] == [m["name"] for m in first["model_stats"]]
    for a, b, m in zip(first["model_stats"], second["model_stats"], merged["model_stats"], strict=True):
        assert list(m) == list(a)  # the same fields, in the same order
        assert (m["name"], m["version"]) == (a["name"], a["version"]) == (b["name"], b["version"])
        assert m["last_inference"] == max(a["last_inference"], b["last_inference"]) == b["last_inference"]
        assert m["inference_count"] == a["inference_count"] + b["inference_count"]
        assert m["execution_count"] == a["execution_count"] + b["execution_count"]
        assert list(m["inference_stats"]) == list(a["inference_stats"])
        for kind, duration in m["inference_stats"].items():
            for field in ("count", "ns"):
                assert (
                    duration[field] == a["inference_stats"][kind][field] + b["inference_stats"][kind][field]
                )
        rows_a = {row["batch_size"]: row for row in a["batch_stats"]}
        rows_b = {row["batch_size"]: row for row in b["batch_stats"]}
        assert [row["batch_size"] for row in m["batch_stats"]] == sorted(rows_a.keys() | rows_b.keys())
        for row in m["batch_stats"]:
            for phase in ("compute_input", "compute_infer", "compute_output"):
                for field in ("count", "ns"):
                    parts = [
                        r[phase][field]
                        for r in (rows_a.get(row["batch_size"]), rows_b.get(row["batch_size"]))
                        if r
                    ]
                    assert row[phase][field] == sum(parts)
        assert m["memory_usage"] == a["memory_usage"] == []
        assert _leaf_types(m) == _leaf_types(a)  # integers stay integers

    # The answers are real and differ where the rules matter: a batch size only the second
    # has, and cache hits in both.
    plain_a, plain_b = (
        next(m for m in answer["model_stats"] if m["name"] == "plain") for answer in (first, second)
    )
    assert 3 not in {row["batch_size"] for row in plain_a["batch_stats"]}
    assert 3 in {row["batch_size"] for row in plain_b["batch_stats"]}
    cached_a = next(m for m in first["model_stats"] if m["name"] == "cached")
    assert cached_a["inference_stats"]["cache_hit"]["count"] == 1


def _leaf_types(value: Any, path: str = "") -> dict[str, type]:
    if isinstance(value, dict):
        return {k: t for key, item in value.items() for k, t in _leaf_types(item, f"{path}.{key}").items()}
    if isinstance(value, list):
        return {k: t for item in value for k, t in _leaf_types(item, f"{path}[]").items()}
    return {path: type(value)}


# Metrics from a real server ---------------------------------------------------------------


def parsed(text: str) -> dict[str, tuple[str, str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]]:
    """Each family by name: its type, HELP text, and samples by name and sorted labels."""
    return {
        family.name: (
            family.type,
            family.documentation,
            {(s.name, tuple(sorted(s.labels.items()))): s.value for s in family.samples},
        )
        for family in text_string_to_metric_families(text)
    }


def _largest(*values: float) -> float:
    numbers = [v for v in values if not math.isnan(v)]
    return max(numbers) if numbers else math.nan


def test_merged_metrics_of_real_scrapes_follow_each_familys_rule(
    two_answers: list[tuple[dict[str, Any], str]],
) -> None:
    (_, text_a), (_, text_b) = two_answers
    merged_text = merge_metrics([text_a, text_b])
    a, b, merged = parsed(text_a), parsed(text_b), parsed(merged_text)

    # Every family once, in the order first seen, with its HELP and TYPE lines once.
    assert list(merged) == list(dict.fromkeys([*a, *b]))
    headers = [line.split()[1:3] for line in merged_text.splitlines() if line.startswith("# ")]
    assert len(headers) == len({tuple(h) for h in headers}) == 2 * len(merged)

    kinds = {kind for kind, _, _ in merged.values()}
    assert {"counter", "gauge", "histogram", "summary"} <= kinds
    checked = {"machine": 0, "quantile": 0, "summed": 0}
    for name, (kind, documentation, samples) in merged.items():
        assert (kind, documentation) == a[name][:2]
        assert samples.keys() == a[name][2].keys() | b[name][2].keys()
        for key, value in samples.items():
            va, vb = a[name][2].get(key, 0.0), b[name][2].get(key, 0.0)
            if name in MACHINE:
                assert value == va, (name, key)  # the first worker's: not doubled
                checked["machine"] += 1
            elif name == "nv_model_load_duration_secs":
                assert value == max(va, vb)
            elif name == "nv_cache_util":
                assert value == (va + vb) / 2
            elif kind == "summary" and key[0] == name:
                assert value == _largest(va, vb) or (math.isnan(value) and math.isnan(_largest(va, vb)))
                checked["quantile"] += 1
            else:
                assert value == va + vb, (name, key)
                checked["summed"] += 1
    assert all(checked.values()), checked
    cpu_memory = a["nv_cpu_memory_total_bytes"][2][("nv_cpu_memory_total_bytes", ())]
    assert (
        cpu_memory > 0
        and merged["nv_cpu_memory_total_bytes"][2][("nv_cpu_memory_total_bytes", ())] == cpu_memory
    )

    # The server's number style: integer sums as integers, and the histograms' +Inf bucket.
    for line in merged_text.splitlines():
        if line.startswith(("nv_inference_count{", "nv_inference_request_success{", "nv_cache_num_hits ")):
            assert re.fullmatch(r"\d+", line.rsplit(" ", 1)[1]), line
    assert 'coreserve_inference_request_latency_us_bucket{model="plain",version="1",le="+Inf"}' in merged_text


def test_every_gpu_family_is_taken_once() -> None:
    assert {name for name, _, _ in GPU_FAMILIES} <= TAKEN_ONCE
    assert MACHINE <= TAKEN_ONCE


# Hand-written cases -----------------------------------------------------------------------


def duration(count: int, ns: int) -> dict[str, int]:
    return {"count": count, "ns": ns}


def model_stats(name: str, inferences: int, batches: dict[int, int], **extra: Any) -> dict[str, Any]:
    """A statistics entry: `batches` maps batch size to executions of 10 ns each phase."""
    return {
        "name": name,
        "version": "1",
        "last_inference": 1000 + inferences,
        "inference_count": inferences,
        "execution_count": sum(batches.values()),
        "inference_stats": {"success": duration(inferences, 100 * inferences)},
        "batch_stats": [
            {
                "batch_size": size,
                **{p: duration(n, 10 * n) for p in ("compute_input", "compute_infer", "compute_output")},
            }
            for size, n in batches.items()
        ],
        "memory_usage": [],
        **extra,
    }


def test_a_model_some_workers_lack_is_listed_and_batch_sizes_join() -> None:
    first = {"model_stats": [model_stats("b", 4, {4: 1}), model_stats("c", 1, {1: 1})]}
    second = {"model_stats": [model_stats("a", 2, {2: 1}), model_stats("b", 6, {1: 2, 4: 1})]}
    before = json.dumps([first, second])

    merged = merge_statistics([first, second])

    assert [m["name"] for m in merged["model_stats"]] == ["b", "c", "a"]
    b, c, a = merged["model_stats"]
    assert (b["inference_count"], b["execution_count"], b["last_inference"]) == (10, 4, 1006)
    assert b["inference_stats"] == {"success": duration(10, 1000)}
    assert [(row["batch_size"], row["compute_infer"]) for row in b["batch_stats"]] == [
        (1, duration(2, 20)),
        (4, duration(2, 20)),
    ]
    assert c == first["model_stats"][1] and a == second["model_stats"][0]
    assert json.dumps([first, second]) == before  # the answers are left as they were
    assert merge_statistics([]) == {"model_stats": []}


def test_response_stats_join_by_key_and_memory_by_device() -> None:
    def answer(empty: int, gpu_bytes: int, cpu_bytes: int | None) -> dict[str, Any]:
        memory = [{"type": "GPU", "id": 0, "byte_size": gpu_bytes}]
        if cpu_bytes is not None:
            memory.append({"type": "CPU", "id": 0, "byte_size": cpu_bytes})
        response = {"0": {"success": duration(2, 20), "empty_response": duration(empty, empty)}}
        if cpu_bytes is None:
            response["1"] = {"success": duration(1, 5)}
        return {"model_stats": [model_stats("m", 1, {}, response_stats=response, memory_usage=memory)]}

    (merged,) = merge_statistics([answer(1, 100, 7), answer(3, 50, None)])["model_stats"]

    assert merged["response_stats"] == {
        "0": {"success": duration(4, 40), "empty_response": duration(4, 4)},
        "1": {"success": duration(1, 5)},
    }
    assert merged["memory_usage"] == [
        {"type": "GPU", "id": 0, "byte_size": 150},
        {"type": "CPU", "id": 0, "byte_size": 7},
    ]


def test_models_of_one_name_in_two_namespaces_stay_apart() -> None:
    """Namespacing lets two models share a name; every worker lists them in the same order."""
    answer = {"model_stats": [model_stats("m", 1, {1: 1}), model_stats("m", 5, {1: 5})]}

    merged = merge_statistics([answer, answer])

    assert [m["inference_count"] for m in merged["model_stats"]] == [2, 10]


SUMMARY = """\
# HELP lat_us Summary of latency
# TYPE lat_us summary
lat_us_count{model="m"} 3
lat_us_sum{model="m"} 30
lat_us{model="m",quantile="0.5"} {q50}
lat_us{model="m",quantile="0.9"} {q90}
"""


def test_quantiles_take_the_largest_number() -> None:
    text_a = SUMMARY.replace("{q50}", "NaN").replace("{q90}", "NaN")
    text_b = SUMMARY.replace("{q50}", "12.5").replace("{q90}", "NaN")
    text_c = SUMMARY.replace("{q50}", "7").replace("{q90}", "NaN")

    assert merge_metrics([text_a, text_b, text_c]).splitlines()[2:] == [
        'lat_us_count{model="m"} 9',
        'lat_us_sum{model="m"} 90',
        'lat_us{model="m",quantile="0.5"} 12.5',
        'lat_us{model="m",quantile="0.9"} NaN',
    ]


def test_families_and_samples_only_later_texts_have_are_kept_in_first_seen_order() -> None:
    first = (
        "# HELP hits Number of hits\n# TYPE hits counter\n"
        'hits{model="a b",note="x} y \\" z"} 3\n'
        '# HELP wait Waits\n# TYPE wait histogram\nwait_bucket{le="1"} 1\nwait_bucket{le="+Inf"} 2\n'
        "wait_count 2\nwait_sum 0.1\n"
    )
    second = (
        "# HELP up Up\n# TYPE up gauge\nup 1.5\n"
        "# HELP hits Number of hits\n# TYPE hits counter\n"
        'hits{model="c"} 4 1700000000000\nhits{model="a b",note="x} y \\" z"} 2\n'
        '# HELP wait Waits\n# TYPE wait histogram\nwait_bucket{le="1"} 0\nwait_bucket{le="+Inf"} 1\n'
        "wait_count 1\nwait_sum 0.2\n"
    )

    merged = merge_metrics([first, second])

    assert merged.splitlines() == [
        "# HELP hits Number of hits",
        "# TYPE hits counter",
        'hits{model="a b",note="x} y \\" z"} 5',
        'hits{model="c"} 4',  # its timestamp dropped
        "# HELP wait Waits",
        "# TYPE wait histogram",
        'wait_bucket{le="1"} 1',
        'wait_bucket{le="+Inf"} 3',
        "wait_count 3",
        f"wait_sum {0.1 + 0.2!r}",  # a float sum as Python writes it: exact
        "# HELP up Up",
        "# TYPE up gauge",
        "up 1.5",
    ]
    assert {family.name for family in text_string_to_metric_families(merged)} == {"hits", "wait", "up"}
    assert merge_metrics([]) == ""


CACHE = """\
# HELP nv_cache_num_entries Number of responses stored in response cache
# TYPE nv_cache_num_entries gauge
nv_cache_num_entries {entries}
# HELP nv_cache_util Cache utilization [0.0 - 1.0]
# TYPE nv_cache_util gauge
nv_cache_util {util}
# HELP nv_model_load_duration_secs Model load time in seconds
# TYPE nv_model_load_duration_secs gauge
nv_model_load_duration_secs{{model="m",version="1"}} {load}
# HELP nv_inference_pending_request_count Instantaneous number of pending requests awaiting execution per-model.
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{{model="m",version="1"}} {pending}
"""


def test_gauges_that_are_not_amounts() -> None:
    texts = [
        CACHE.format(entries=10, util=0.25, load=1.5, pending=2),
        CACHE.format(entries=12, util=0.5, load=2.25, pending=1),
    ]

    def values(merged: str) -> list[str]:
        return [line.rsplit(" ", 1)[1] for line in merged.splitlines() if not line.startswith("#")]

    assert values(merge_metrics(texts)) == ["22", "0.375", "2.25", "3"]
    # One store all workers share (Redis): its entry count is the same store's in every text.
    assert values(merge_metrics(texts, shared_cache=True)) == ["10", "0.375", "2.25", "3"]


# What workers that died had counted -------------------------------------------------------

LIVE = """# HELP nv_inference_request_success Number of successful inference requests
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="add",version="1"} 5
# HELP nv_inference_pending_request_count Instantaneous number of pending requests
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="add",version="1"} 1
# HELP nv_inference_queue_summary_us Summary of inference queue duration
# TYPE nv_inference_queue_summary_us summary
nv_inference_queue_summary_us_count{model="add",version="1"} 5
nv_inference_queue_summary_us_sum{model="add",version="1"} 50
nv_inference_queue_summary_us{model="add",version="1",quantile="0.5"} 10
# HELP nv_energy_consumption GPU energy consumption
# TYPE nv_energy_consumption counter
nv_energy_consumption{gpu_uuid="GPU-1"} 100
"""
PAST = """# TYPE nv_inference_request_success counter
nv_inference_request_success{model="add",version="1"} 7
nv_inference_request_success{model="gone",version="1"} 3
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="add",version="1"} 4
# TYPE nv_inference_queue_summary_us summary
nv_inference_queue_summary_us_count{model="add",version="1"} 7
nv_inference_queue_summary_us_sum{model="add",version="1"} 70
nv_inference_queue_summary_us{model="add",version="1",quantile="0.5"} 99
# TYPE nv_energy_consumption counter
nv_energy_consumption{gpu_uuid="GPU-1"} 90
# TYPE coreserve_only_in_the_past counter
coreserve_only_in_the_past 1
"""


def test_what_a_dead_worker_counted_is_carried_into_the_counters_only() -> None:
    merged = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(merge_metrics([LIVE], carried=[PAST]))
        for sample in family.samples
    }
    add = (("model", "add"), ("version", "1"))
    assert merged[("nv_inference_request_success_total", add)] == 12  # counted on
    assert merged[("nv_inference_pending_request_count", add)] == 1  # a gauge went with it
    assert merged[("nv_inference_queue_summary_us_count", add)] == 12
    assert merged[("nv_inference_queue_summary_us_sum", add)] == 120
    assert merged[("nv_inference_queue_summary_us", tuple(sorted((*add, ("quantile", "0.5")))))] == 10
    assert merged[("nv_energy_consumption_total", (("gpu_uuid", "GPU-1"),))] == 100  # the machine's
    # A model no live worker serves, a family no live worker has: not brought back.
    assert not [key for key in merged if ("model", "gone") in key[1] or key[0].startswith("coreserve_only")]


def test_a_model_loaded_again_forgets_what_was_carried() -> None:
    kept = without_model_metrics(PAST, "add")
    assert 'model="add"' not in kept and 'nv_inference_request_success{model="gone",version="1"} 3' in kept
    assert merge_metrics([LIVE], carried=[kept]).count("nv_inference_request_success{") == 1
    assert 'nv_inference_request_success{model="add",version="1"} 5' in merge_metrics([LIVE], carried=[kept])


def test_what_a_dead_worker_counted_is_added_to_the_statistics_of_models_still_served() -> None:
    def model(name: str, count: int, memory: int) -> dict[str, Any]:
        return {
            "name": name,
            "version": "1",
            "inference_count": count,
            "inference_stats": {"success": {"count": count, "ns": 10 * count}},
            "memory_usage": [{"type": "CPU", "id": 0, "byte_size": memory}],
        }

    live = {"model_stats": [model("add", 5, 100)]}
    past = {"model_stats": [model("add", 7, 100), model("gone", 3, 100)]}
    (merged,) = merge_statistics([live], [past])["model_stats"]
    assert merged["inference_count"] == 12 and merged["inference_stats"]["success"] == {
        "count": 12,
        "ns": 120,
    }
    assert merged["memory_usage"] == [{"type": "CPU", "id": 0, "byte_size": 100}]  # went with it
    assert without_model_statistics(past, "add") == {"model_stats": [model("gone", 3, 100)]}
