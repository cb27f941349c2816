"""The metric families of a scrape are Triton's: names, types, HELP texts and label sets.

The reference list (tests/fixtures/triton_metric_families.json) comes from scrapes of the real
tritonserver 2.51 and, for the families added after it, from Triton's documentation and sources.
"""

from __future__ import annotations

import json
import queue
import shutil
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from coreserve.server.metrics._system_metrics import GpuMetrics
from coreserve.testing import ServerProcess
from support.paths import TESTS
from support.waiting import wait_until

PYTHON_MODELS = TESTS / "plugins" / "python" / "models"
REFERENCE = json.loads((TESTS / "fixtures" / "triton_metric_families.json").read_text())["families"]
TRITON = {family["name"]: family for family in REFERENCE}
LATENCY_COUNTERS = {
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
}
# Families of ours (docs/serving/metrics.md lists them): prometheus-client's process and Python collectors, and
# coreserve's own latency histograms. None uses a name of Triton's.
OURS = ("process_", "python_", "coreserve_")
CUSTOM_BUCKETS = """
model_metrics {
  metric_control [
    {
      metric_identifier { family: "nv_inference_first_response_histogram_ms" }
      histogram_options { buckets: [ 2.5, 1 ] }
    }
  ]
}
"""


def _when(*conditions: str) -> set[str]:
    return {family["name"] for family in REFERENCE if family["when"] in conditions}


def _by_default() -> set[str]:
    """Triton's default families here: the GPU ones join them where NVML finds a GPU."""
    return _when("default", "gpu") if _gpus_here()[0] else _when("default")


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("families")
    for name in ("add_one", "countdown"):
        shutil.copytree(PYTHON_MODELS / name, root / name)
    shutil.copytree(PYTHON_MODELS / "countdown", root / "countdown_buckets")
    with (root / "countdown_buckets" / "config.pbtxt").open("a") as config:
        config.write(CUSTOM_BUCKETS)
    return root


def _serve(repository: Path, *flags: str) -> ServerProcess:
    return ServerProcess([repository], list(flags)).start()


@pytest.fixture(scope="module")
def default_server(repository: Path) -> Iterator[ServerProcess]:
    server = _serve(repository)
    yield server
    server.close()


@pytest.fixture(scope="module")
def configured_server(repository: Path) -> Iterator[ServerProcess]:
    server = _serve(
        repository,
        "--metrics-config=summary_latencies=true",
        "--metrics-config",
        "histogram_latencies=true",
        "--metrics-config=counter_latencies=false",
        "--metrics-config=summary_quantiles=0.5:0.05,0.99:0.001",
    )
    yield server
    server.close()


def _send(server: ServerProcess, streams: int = 2) -> None:
    """One add_one request over HTTP; `streams` countdown(2) streams to each decoupled model."""
    client = httpclient.InferenceServerClient(server.http_url)
    tensor = httpclient.InferInput("INPUT0", [1, 3], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 3), np.float32))
    client.infer("add_one", [tensor])
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue[object] = queue.Queue()
    grpc.start_stream(callback=lambda result, error: answers.put(error or result))
    try:
        for model in ("countdown", "countdown_buckets"):
            for _ in range(streams):
                n = grpcclient.InferInput("N", [1], "INT32")
                n.set_data_from_numpy(np.array([2], np.int32))
                grpc.async_stream_infer(model, [n])
                for _ in range(2):
                    answer = answers.get(timeout=30)
                    assert not isinstance(answer, Exception), answer
    finally:
        grpc.stop_stream()
        grpc.close()


def _scrape(server: ServerProcess) -> str:
    with urllib.request.urlopen(server.metrics_url, timeout=30) as response:
        return response.read().decode()


def _families(text: str) -> dict[str, Metric]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def _labels(family: Metric) -> list[str]:
    return sorted({key for sample in family.samples for key in sample.labels})


def _assert_tritons(families: dict[str, Metric], expected: set[str]) -> None:
    ours = {name for name in families if name.startswith(OURS)}
    assert set(families) - ours == expected
    for name in expected:
        reference, family = TRITON[name], families[name]
        assert (family.type, _labels(family), family.documentation) == (
            reference["type"],
            reference["labels"],
            reference["help"],
        ), name


def test_default_scrape_has_tritons_default_families(default_server: ServerProcess) -> None:
    _send(default_server)
    families = _families(_scrape(default_server))
    # Triton's defaults: counts and latency counters, no summaries, no histograms.
    _assert_tritons(families, _by_default())
    # Of ours, only the executing requests (beside Triton's pending ones).
    assert [name for name in families if name.startswith("coreserve_")] == [
        "coreserve_inference_executing_request_count"
    ]
    reasons = {s.labels["reason"] for s in families["nv_inference_request_failure"].samples}
    assert reasons == {"REJECTED", "CANCELED", "BACKEND", "OTHER"}


def test_metrics_config_switches_latency_families_as_tritons(configured_server: ServerProcess) -> None:
    _send(configured_server, streams=3)
    families = _families(_scrape(configured_server))
    expected = (_by_default() - LATENCY_COUNTERS) | _when("summary_latencies", "histogram_latencies")
    _assert_tritons(families, expected)
    quantiles = {s.labels.get("quantile") for s in families["nv_inference_request_summary_us"].samples}
    assert quantiles == {"0.5", "0.99", None}  # None: the _count and _sum samples
    counts = {
        s.labels["model"]: s.value
        for s in families["nv_inference_request_summary_us"].samples
        if s.name.endswith("_count")
    }
    assert counts == {"add_one": 1, "countdown": 3, "countdown_buckets": 3}
    # The first-response histogram: decoupled models only, Triton's buckets or the model's own.
    histogram = families["nv_inference_first_response_histogram_ms"].samples
    buckets: dict[str, list[tuple[str, float]]] = {}
    for sample in histogram:
        if sample.name.endswith("_bucket"):
            buckets.setdefault(sample.labels["model"], []).append((sample.labels["le"], sample.value))
    assert {model: [le for le, _ in pairs] for model, pairs in buckets.items()} == {
        "countdown": ["100", "500", "2000", "5000", "+Inf"],  # written as Triton's docs show them
        "countdown_buckets": ["1", "2.5", "+Inf"],
    }
    assert buckets["countdown"][-1] == ("+Inf", 3)
    first = {s.labels["model"]: s.value for s in histogram if s.name.endswith("_count")}
    assert first == {"countdown": 3, "countdown_buckets": 3}


def _gpus_here() -> tuple[int, str]:
    """How many GPUs the server's NVML reader finds here, and its words for none."""
    gpus, found = GpuMetrics.open()
    if gpus is None:
        return 0, found
    gpus.close()
    return int(found.split()[0]), found


def test_cpu_metrics_off_gpu_metrics_absent_without_nvml(tmp_path: Path) -> None:
    count, why = _gpus_here()
    if count:
        pytest.skip(f"NVML finds {count} GPU(s) here: test_gpu_families_are_tritons covers them")
    server = _serve(tmp_path, "--allow-cpu-metrics=false", "--allow-gpu-metrics", "true")
    try:
        families = _families(_scrape(server))
        assert not [name for name in families if name.startswith(("nv_cpu_", "nv_gpu_", "nv_energy"))]
        # One clear line: the package is missing, NVML fails (no driver), or it finds no GPU.
        assert server.log.count(f"GPU metrics are not reported: {why}") == 1, server.log
        assert "Traceback" not in server.log
    finally:
        server.close()


@pytest.mark.gpu
def test_gpu_families_are_tritons(tmp_path: Path) -> None:
    count, why = _gpus_here()
    if not count:
        pytest.skip(f"no NVML: the GPU families need NVML (nvidia-ml-py) and an NVIDIA GPU: {why}")
    server = _serve(tmp_path, "--allow-gpu-metrics=true", "--metrics-interval-ms=200")
    gpu = _when("gpu")

    def every_gpu_read() -> dict[str, Metric] | None:
        """The scrape once it has each GPU family for each GPU: the driver averages utilization
        and power over its own samples, so a poll may come before it has them."""
        families = _families(_scrape(server))
        read = all(
            len({sample.labels.get("gpu_uuid") for sample in families[name].samples}) == count
            for name in gpu
            if name in families
        )
        return families if read and gpu <= set(families) else None

    try:
        families = wait_until(every_gpu_read, f"every GPU family read for {count} GPU(s)", 30)
        _assert_tritons({name: families[name] for name in gpu if name in families}, gpu)
        for name in gpu:
            uuids = [sample.labels["gpu_uuid"] for sample in families[name].samples]
            assert len(set(uuids)) == count and all(uuid.startswith("GPU-") for uuid in uuids), name
        assert all(s.value > 0 for s in families["nv_gpu_memory_total_bytes"].samples)
        assert all(0 <= s.value <= 1 for s in families["nv_gpu_utilization"].samples)
        assert server.log.count(f"Collecting GPU metrics: {count} GPU(s)") == 1
    finally:
        server.close()


def test_cpu_families_are_polled_every_metrics_interval(tmp_path: Path) -> None:
    server = _serve(tmp_path, "--metrics-interval-ms=600000")
    try:
        first = _families(_scrape(server))
        time.sleep(1.5)
        second = _families(_scrape(server))
        for name in ("nv_cpu_utilization", "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes"):
            assert first[name].samples == second[name].samples, name  # one reading until the next poll
        assert first["nv_cpu_memory_total_bytes"].samples[0].value > 0
    finally:
        server.close()
