"""The metrics module: Triton's families, HELP and TYPE lines and labels, moving with real requests.

Scrapes come from `coreserve.Server.metrics()` (the text `/metrics` serves, with no port) of
in-process servers over an ONNX add/sub model and `count`, a decoupled backend written here
through the public backend API (it answers N, N-1 … 1, and holds the requests a test names
until the test releases them). Each scrape is read with prometheus-client's own parser; the
reference for names, types, HELP texts and labels is tests/fixtures/triton_metric_families.json
(from tritonserver 2.51's scrapes) and the scrape of Triton itself in the fixtures.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

import coreserve
from coreserve import InferenceRequest, InvalidArgumentError, ModelConfig
from coreserve.backend import (
    BackendRegistry,
    BaseBackend,
    InstancePlacement,
    ModelFiles,
    Responder,
    ServerContext,
    hookimpl,
)
from coreserve.scheduling.cache.responses import CacheStatistics
from coreserve.scheduling.statistics import FIRST_RESPONSE_BUCKETS_MS, HISTOGRAM_BUCKETS_US
from coreserve.server.metrics._prometheus import FAILURE_ORDER, render_cache_metrics
from support.model_builders import ADD_SUB_CONFIG, add_sub_model, write_model
from support.paths import TESTS

FIXTURES = TESTS / "fixtures"
REFERENCE = {
    f["name"]: f for f in json.loads((FIXTURES / "triton_metric_families.json").read_text())["families"]
}
COUNT = """
backend: "count"
max_batch_size: 0
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "VALUE" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
model_transaction_policy { decoupled: true }
"""
# Triton's model families by default, in the order of its scrape; then the one added after 2.51.
MODEL_FAMILIES = [
    ("nv_inference_request_success", "counter"),
    ("nv_inference_request_failure", "counter"),
    ("nv_inference_count", "counter"),
    ("nv_inference_exec_count", "counter"),
    ("nv_inference_request_duration_us", "counter"),
    ("nv_inference_queue_duration_us", "counter"),
    ("nv_inference_compute_input_duration_us", "counter"),
    ("nv_inference_compute_infer_duration_us", "counter"),
    ("nv_inference_compute_output_duration_us", "counter"),
    ("nv_inference_pending_request_count", "gauge"),
    ("nv_model_load_duration_secs", "gauge"),
]
CPU_FAMILIES = [
    ("nv_cpu_utilization", "gauge"),
    ("nv_cpu_memory_total_bytes", "gauge"),
    ("nv_cpu_memory_used_bytes", "gauge"),
]
SUMMARIES = [
    "nv_inference_request_summary_us",
    "nv_inference_queue_summary_us",
    "nv_inference_compute_input_summary_us",
    "nv_inference_compute_infer_summary_us",
    "nv_inference_compute_output_summary_us",
]
OWN_HISTOGRAMS = ["coreserve_inference_request_latency_us", "coreserve_inference_queue_latency_us"]
FIRST_RESPONSE = "nv_inference_first_response_histogram_ms"


class CountBackend(BaseBackend):
    """A decoupled model: N responses N, N-1 … 1, then the final flag; a negative N fails in
    the backend. Requests whose ids are in `holding` wait after their first response until
    `release` (from any thread) or their cancellation."""

    name = "count"
    default_model_filename = "model.count"

    def __init__(self) -> None:
        self.holding: set[str] = set()
        self.held: dict[str, threading.Event] = {}  # set once the instance holds the request
        self._gates: dict[str, asyncio.Event] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def load_instance(
        self, model: ModelFiles, config: ModelConfig, placement: InstancePlacement, server: ServerContext
    ) -> CountInstance:
        return CountInstance(self)

    def hold(self, request_id: str) -> threading.Event:
        self.holding.add(request_id)
        return self.held.setdefault(request_id, threading.Event())

    def release(self, request_id: str) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self.gate(request_id).set)

    def gate(self, request_id: str) -> asyncio.Event:
        return self._gates.setdefault(request_id, asyncio.Event())


class CountInstance:
    def __init__(self, backend: CountBackend) -> None:
        self._backend = backend

    async def execute(self, requests: Sequence[InferenceRequest], responder: Responder) -> None:
        backend = self._backend
        backend._loop = asyncio.get_running_loop()
        for request in requests:
            n = int(request.inputs["N"][0])
            if n < 0:
                responder.send_error(request, InvalidArgumentError(f"N must not be negative, not {n}"))
                continue
            for value in range(n, 0, -1):
                responder.send(request, {"VALUE": np.array([value], np.int32)}, final=False)
                if value == n and request.id in backend.holding:
                    cancelled = asyncio.Event()
                    forget = request.on_cancel(cancelled.set)
                    backend.held[request.id].set()
                    waits = [asyncio.ensure_future(e.wait()) for e in (backend.gate(request.id), cancelled)]
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                    for wait in waits:
                        wait.cancel()
                    forget()
                    if request.is_cancelled():
                        break
            responder.send_final(request)

    async def close(self) -> None:
        pass


class CountPlugin:
    def __init__(self, backend: CountBackend) -> None:
        self.backend = backend

    @hookimpl
    def coreserve_register_backends(self, register: BackendRegistry) -> None:
        register.add(self.backend)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("metrics-models")
    write_model(root, "add_sub", add_sub_model(), ADD_SUB_CONFIG)
    (root / "count" / "1").mkdir(parents=True)
    (root / "count" / "1" / "model.count").write_bytes(b"")
    (root / "count" / "config.pbtxt").write_text(COUNT)
    return root


@pytest.fixture(scope="module")
def count() -> CountBackend:
    return CountBackend()


@pytest.fixture(scope="module")
def server(repository: Path, count: CountBackend) -> Iterator[coreserve.Server]:
    """Triton's default metrics (latency counters, no summaries or histograms), CPU on, GPU off."""
    with coreserve.Server(repository, plugins=[CountPlugin(count)], allow_gpu_metrics=False) as running:
        yield running


@pytest.fixture(scope="module")
def configured(repository: Path) -> Iterator[coreserve.Server]:
    """--metrics-config summary_latencies=true,histogram_latencies=true,counter_latencies=false,
    summary_quantiles=0.5,0.9; CPU and GPU metrics off."""
    settings: dict[str, Any] = {
        "summary_latencies": True,
        "histogram_latencies": True,
        "counter_latencies": False,
        "summary_quantiles": (0.5, 0.9),
        "allow_cpu_metrics": False,
        "allow_gpu_metrics": False,
    }
    with coreserve.Server(repository, plugins=[CountPlugin(CountBackend())], **settings) as running:
        yield running


def add_sub(server: coreserve.Server, rows: int) -> None:
    inputs = {"INPUT0": np.ones((rows, 4), np.float32), "INPUT1": np.ones((rows, 4), np.float32)}
    server.model("add_sub").infer(inputs)


def count_down(server: coreserve.Server, n: int, request_id: str = "") -> list[int]:
    return [
        int(r.outputs["VALUE"][0])
        for r in server.model("count").stream({"N": np.array([n], np.int32)}, request_id=request_id)
    ]


def families(text: str) -> dict[str, Any]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample by name (as written) and sorted labels."""
    return {
        # The parser names a counter's samples <name>_total; Triton's text has no suffix.
        (
            family.name if family.type == "counter" else sample.name,
            tuple(sorted(sample.labels.items())),
        ): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(text: str, name: str, **labels: str) -> float:
    return samples(text)[(name, tuple(sorted(labels.items())))]


# Families, HELP, TYPE and labels -----------------------------------------------------------


def test_the_default_scrape_has_tritons_families_in_tritons_order(server: coreserve.Server) -> None:
    add_sub(server, 1)
    text = server.metrics()
    parsed = list(text_string_to_metric_families(text))
    ours = [(family.name, family.type) for family in parsed if family.name.startswith("nv_")]
    assert ours == MODEL_FAMILIES + CPU_FAMILIES
    # The rest are prometheus-client's process and Python collectors and our executing requests
    # (beside the pending ones): no name of Triton's.
    rest = {family.name for family in parsed if not family.name.startswith("nv_")}
    assert {name.split("_")[0] for name in rest} == {"coreserve", "process", "python"}
    assert {name for name in rest if name.startswith("coreserve")} == {
        "coreserve_inference_executing_request_count"
    }
    for family in parsed:
        if family.name in REFERENCE:
            reference = REFERENCE[family.name]
            assert (family.type, family.documentation) == (reference["type"], reference["help"]), family.name
            assert {tuple(sorted(s.labels)) for s in family.samples} == {tuple(reference["labels"])}, (
                family.name
            )


def test_help_and_type_lines_are_tritons_word_for_word(server: coreserve.Server) -> None:
    """Triton's counters have no `_total` (prometheus-client's writer would add it)."""
    triton = (FIXTURES / "tritonserver_2_51_metrics_default.txt").read_text().splitlines()
    ours = server.metrics().splitlines()

    def headers(lines: list[str]) -> list[str]:
        names = {name for name, _ in MODEL_FAMILIES + CPU_FAMILIES}
        return [line for line in lines if line.startswith("# ") and line.split()[2] in names]

    # Triton 2.51 has every family but the load duration, which later Triton versions added.
    load = [
        "# HELP nv_model_load_duration_secs Model load time in seconds",
        "# TYPE nv_model_load_duration_secs gauge",
    ]
    expected = headers(triton)
    at = expected.index("# TYPE nv_inference_pending_request_count gauge") + 1
    assert headers(ours) == expected[:at] + load + expected[at:]
    assert not [line for line in ours if re.match(r"nv_\w+_total[{ ]", line)]


def test_each_version_has_its_samples_with_the_failure_reasons_in_tritons_order(
    server: coreserve.Server,
) -> None:
    lines = server.metrics().splitlines()
    failure = [line.rsplit(" ", 1)[0] for line in lines if line.startswith("nv_inference_request_failure{")]
    assert failure == [
        f'nv_inference_request_failure{{model="{model}",reason="{reason}",version="1"}}'
        for model in ("add_sub", "count")  # by model name
        for reason in FAILURE_ORDER
    ]
    assert FAILURE_ORDER == ("OTHER", "BACKEND", "CANCELED", "REJECTED")
    success = [line.rsplit(" ", 1)[0] for line in lines if line.startswith("nv_inference_request_success{")]
    assert success == [
        'nv_inference_request_success{model="add_sub",version="1"}',
        'nv_inference_request_success{model="count",version="1"}',
    ]
    load = value("\n".join(lines) + "\n", "nv_model_load_duration_secs", model="add_sub", version="1")
    assert load > 0 and math.isfinite(load)


def test_cpu_families_have_no_labels_and_sane_values(server: coreserve.Server) -> None:
    text = server.metrics()
    utilization = value(text, "nv_cpu_utilization")
    total, used = value(text, "nv_cpu_memory_total_bytes"), value(text, "nv_cpu_memory_used_bytes")
    assert 0.0 <= utilization <= 1.0
    assert 0 < used <= total


# Counters move with requests ---------------------------------------------------------------


def test_counters_move_by_exactly_the_requests_served(server: coreserve.Server) -> None:
    labels = {"model": "add_sub", "version": "1"}
    before = server.metrics()
    for rows in (1, 2, 3, 2):
        add_sub(server, rows)
    for _ in range(3):  # refused before the model runs: not counted, as on Triton
        with pytest.raises(InvalidArgumentError):
            server.model("add_sub").infer({"INPUT0": np.ones((1, 4), np.float32)})
    after = server.metrics()

    def delta(name: str, **extra: str) -> float:
        return value(after, name, **labels, **extra) - value(before, name, **labels, **extra)

    moved = {
        name: delta(name)
        for name in ("nv_inference_request_success", "nv_inference_count", "nv_inference_exec_count")
    }
    assert moved == {"nv_inference_request_success": 4, "nv_inference_count": 8, "nv_inference_exec_count": 4}
    assert [delta("nv_inference_request_failure", reason=why) for why in FAILURE_ORDER] == [0, 0, 0, 0]
    assert value(after, "nv_inference_pending_request_count", **labels) == 0


def test_latency_counters_are_the_statistics_durations_in_microseconds(server: coreserve.Server) -> None:
    add_sub(server, 2)
    text = server.metrics()
    (stats,) = server.model("add_sub").statistics()["model_stats"]
    durations = stats["inference_stats"]
    labels = {"model": "add_sub", "version": "1"}
    assert {
        "success": value(text, "nv_inference_request_duration_us", **labels),
        "queue": value(text, "nv_inference_queue_duration_us", **labels),
        "compute_input": value(text, "nv_inference_compute_input_duration_us", **labels),
        "compute_infer": value(text, "nv_inference_compute_infer_duration_us", **labels),
        "compute_output": value(text, "nv_inference_compute_output_duration_us", **labels),
    } == {
        kind: durations[kind]["ns"] // 1000
        for kind in ("success", "queue", "compute_input", "compute_infer", "compute_output")
    }
    assert value(text, "nv_inference_request_success", **labels) == durations["success"]["count"]
    assert value(text, "nv_inference_count", **labels) == stats["inference_count"]


def test_a_decoupled_models_failures_pending_and_cancellations(
    server: coreserve.Server, count: CountBackend
) -> None:
    labels = {"model": "count", "version": "1"}
    before = server.metrics()
    assert count_down(server, 3) == [3, 2, 1]
    with pytest.raises(InvalidArgumentError, match="N must not be negative, not -1"):
        count_down(server, -1)  # fails in the backend: reason BACKEND
    # Held after its first response: executing until released, and no longer pending (as on
    # Triton, a request leaves the pending count as an instance begins executing it).
    held = count.hold("held")
    responses = server.model("count").stream({"N": np.array([2], np.int32)}, request_id="held")
    assert int(next(responses).outputs["VALUE"][0]) == 2
    assert held.wait(60)
    while_held = server.metrics()
    count.release("held")
    assert [int(r.outputs["VALUE"][0]) for r in responses] == [1]
    # Held again and left: leaving a stream early cancels its request (reason CANCELED).
    count.hold("left")
    for response in server.model("count").stream({"N": np.array([5], np.int32)}, request_id="left"):
        assert int(response.outputs["VALUE"][0]) == 5
        break
    assert count_down(server, 1) == [1]  # the one instance takes it once "left" has ended
    after = server.metrics()

    def delta(name: str, **extra: str) -> float:
        return value(after, name, **labels, **extra) - value(before, name, **labels, **extra)

    gauges = ("nv_inference_pending_request_count", "coreserve_inference_executing_request_count")
    assert [value(while_held, name, **labels) for name in gauges] == [0, 1]
    assert [value(after, name, **labels) for name in gauges] == [0, 0]
    assert [delta("nv_inference_request_failure", reason=why) for why in FAILURE_ORDER] == [0, 1, 1, 0]
    assert delta("nv_inference_request_success") == 3  # count_down(3), "held", count_down(1)
    assert delta("nv_inference_exec_count") == 5  # every request the instance was given


# --metrics-config: summaries and histograms -------------------------------------------------


def test_summaries_and_histograms_replace_the_latency_counters_when_asked(
    configured: coreserve.Server,
) -> None:
    for rows in (1, 3):
        add_sub(configured, rows)
    assert count_down(configured, 2) == [2, 1]
    text = configured.metrics()
    parsed = families(text)
    kinds = {
        name: family.type for name, family in parsed.items() if not name.startswith(("process_", "python_"))
    }
    assert kinds == {
        **{name: kind for name, kind in MODEL_FAMILIES[:4] + MODEL_FAMILIES[9:]},  # no latency counters
        **{name: "summary" for name in SUMMARIES},
        FIRST_RESPONSE: "histogram",
        **{name: "histogram" for name in OWN_HISTOGRAMS},
        "coreserve_inference_executing_request_count": "gauge",
    }
    for name in [*SUMMARIES, FIRST_RESPONSE]:
        assert parsed[name].documentation == REFERENCE[name]["help"], name


def _labelled(family: Any, model: str) -> list[Sample]:
    return [s for s in family.samples if s.labels.get("model") == model]


def test_a_summary_has_the_configured_quantiles_and_counts_every_success(
    configured: coreserve.Server,
) -> None:
    add_sub(configured, 1)
    text = configured.metrics()
    successes = value(text, "nv_inference_request_success", model="add_sub", version="1")
    for name in SUMMARIES:
        rows = _labelled(families(text)[name], "add_sub")
        assert [(s.name, s.labels.get("quantile")) for s in rows] == [
            (f"{name}_count", None),
            (f"{name}_sum", None),
            (name, "0.5"),
            (name, "0.9"),
        ]
        assert rows[0].value == successes
        assert rows[2].value <= rows[3].value  # quantiles in order


def test_histograms_count_every_success_in_cumulative_buckets(configured: coreserve.Server) -> None:
    add_sub(configured, 2)
    count_down(configured, 3)
    text = configured.metrics()
    parsed = families(text)
    for name in OWN_HISTOGRAMS:
        rows = _labelled(parsed[name], "add_sub")
        buckets = [s for s in rows if s.name == f"{name}_bucket"]
        assert [s.labels["le"] for s in buckets] == [
            f"{float(bound):g}" for bound in HISTOGRAM_BUCKETS_US
        ] + ["+Inf"]
        counts = [s.value for s in buckets]
        assert counts == sorted(counts)  # cumulative
        (total,) = [s.value for s in rows if s.name == f"{name}_count"]
        assert (
            counts[-1] == total == value(text, "nv_inference_request_success", model="add_sub", version="1")
        )
    # The first-response histogram is Triton's, for decoupled models alone.
    first = parsed[FIRST_RESPONSE]
    assert {s.labels["model"] for s in first.samples} == {"count"}
    buckets = [s for s in first.samples if s.name == f"{FIRST_RESPONSE}_bucket"]
    assert [s.labels["le"] for s in buckets] == [f"{bound:g}" for bound in FIRST_RESPONSE_BUCKETS_MS] + [
        "+Inf"
    ]
    (total,) = [s.value for s in first.samples if s.name == f"{FIRST_RESPONSE}_count"]
    assert (
        buckets[-1].value == total == value(text, "nv_inference_request_success", model="count", version="1")
    )


def test_metrics_turned_off_give_an_empty_scrape(repository: Path) -> None:
    with coreserve.Server(repository, plugins=[CountPlugin(CountBackend())], allow_metrics=False) as off:
        add_sub(off, 1)
        assert off.metrics() == ""


# The cache-wide families -------------------------------------------------------------------


def test_cache_families_are_tritons_gauges_without_labels() -> None:
    statistics = CacheStatistics(
        entries=3, lookups=10, hits=6, misses=4, evictions=1, lookup_ns=12_345_678, insertion_ns=9_999,
        used_bytes=256, size_bytes=1024,
    )  # fmt: skip
    text = render_cache_metrics(statistics)
    expected = [
        ("nv_cache_num_entries", 3),
        ("nv_cache_num_lookups", 10),
        ("nv_cache_num_hits", 6),
        ("nv_cache_num_misses", 4),
        ("nv_cache_num_evictions", 1),
        ("nv_cache_lookup_duration", 12345),  # microseconds, rounded down
        ("nv_cache_insertion_duration", 9),
        ("nv_cache_util", 0.25),
    ]
    lines = text.splitlines()
    assert lines[2::3] == [f"{name} {number}" for name, number in expected]
    for family in text_string_to_metric_families(text):
        reference = REFERENCE[family.name]
        assert (family.type, family.documentation, reference["labels"]) == ("gauge", reference["help"], [])
