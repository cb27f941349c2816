"""Prometheus metrics and the statistics extension move by exactly the requests sent."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerProcess
from support.model_builders import add_sub_model, identity_model, write_model

ADD_SUB = """
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
STRINGS = """
backend: "onnxruntime"
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
"""
TRITON_COUNTERS = (
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("metrics")
    write_model(repository, "add_sub", add_sub_model("FP32", ["batch", 4]), ADD_SUB)
    write_model(repository, "strings", identity_model("BYTES", ["n"]), STRINGS)
    flags = ["--metrics-config", "histogram_latencies=true", "--metrics-config=summary_latencies=true"]
    process = ServerProcess([repository], flags).start()
    yield process
    process.close()


def _scrape(server: ServerProcess) -> str:
    with urllib.request.urlopen(server.metrics_url, timeout=30) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return response.read().decode()


def _values(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample as {(name, sorted labels): value}, parsed by prometheus-client."""
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            # The parser names counter samples <name>_total; Triton's text has no suffix.
            name = sample.name.removesuffix("_total") if family.type == "counter" else sample.name
            values[(name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


def _metric(values: dict, name: str, **labels: str) -> float:
    return values.get((name, tuple(sorted(labels.items()))), 0.0)


def _add_sub_http(client: httpclient.InferenceServerClient, batch: int) -> None:
    inputs = [
        httpclient.InferInput("INPUT0", [batch, 4], "FP32"),
        httpclient.InferInput("INPUT1", [batch, 4], "FP32"),
    ]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones((batch, 4), np.float32))
    client.infer("add_sub", inputs)


def _add_sub_grpc(client: grpcclient.InferenceServerClient, batch: int) -> None:
    inputs = [
        grpcclient.InferInput("INPUT0", [batch, 4], "FP32"),
        grpcclient.InferInput("INPUT1", [batch, 4], "FP32"),
    ]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones((batch, 4), np.float32))
    client.infer("add_sub", inputs)


def test_names_and_types_are_tritons(server: ServerProcess) -> None:
    text = _scrape(server)
    for name in TRITON_COUNTERS:
        assert f"# TYPE {name} counter" in text
        assert f"{name}_total" not in text
    assert "# TYPE nv_inference_pending_request_count gauge" in text
    assert re.search(r'^nv_inference_count\{model="add_sub",version="1"\} ', text, re.M)
    assert "# TYPE nv_inference_request_summary_us summary" in text
    assert "# TYPE coreserve_inference_request_latency_us histogram" in text
    assert "# TYPE nv_model_load_duration_secs gauge" in text
    assert "process_cpu_seconds_total" in text and "nv_cpu_utilization" in text


def test_counters_move_by_exactly_the_requests_sent(server: ServerProcess) -> None:
    labels = {"model": "add_sub", "version": "1"}
    before = _values(_scrape(server))
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        for batch in (1, 2, 3):
            _add_sub_http(http, batch)
            _add_sub_grpc(grpc, batch)
        for _ in range(4):  # invalid for the model: not counted, as on Triton 2.51 (checked side by side)
            bad = [httpclient.InferInput("INPUT0", [1, 4], "FP32")]
            bad[0].set_data_from_numpy(np.ones((1, 4), np.float32))
            with pytest.raises(InferenceServerException):
                http.infer("add_sub", bad)
    finally:
        http.close()
        grpc.close()
    after = _values(_scrape(server))

    def delta(name: str, **extra: str) -> float:
        return _metric(after, name, **labels, **extra) - _metric(before, name, **labels, **extra)

    assert delta("nv_inference_request_success") == 6
    assert delta("nv_inference_exec_count") == 6
    assert delta("nv_inference_count") == 12  # batch sizes 1+2+3, twice
    assert delta("nv_inference_request_failure", reason="OTHER") == 0
    assert delta("nv_inference_request_failure", reason="BACKEND") == 0
    assert delta("nv_inference_request_duration_us") > 0
    assert delta("nv_inference_request_summary_us_count") == 6
    assert delta("coreserve_inference_request_latency_us_count") == 6
    assert _metric(after, "nv_inference_pending_request_count", **labels) == 0
    assert _metric(after, "nv_inference_request_summary_us", **labels, quantile="0.99") > 0


def test_backend_failures_have_their_reason(server: ServerProcess) -> None:
    labels = {"model": "strings", "version": "1", "reason": "BACKEND"}
    before = _metric(_values(_scrape(server)), "nv_inference_request_failure", **labels)
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        tensor = httpclient.InferInput("INPUT0", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([b"\xff"], dtype=np.object_))
        for _ in range(3):
            with pytest.raises(InferenceServerException, match="not UTF-8"):
                client.infer("strings", [tensor])
    finally:
        client.close()
    after = _metric(_values(_scrape(server)), "nv_inference_request_failure", **labels)
    assert after - before == 3


def test_statistics_agree_between_clients_and_requests(server: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        before = http.get_inference_statistics("add_sub")["model_stats"][0]
        for _ in range(5):
            _add_sub_http(http, 4)
        _add_sub_grpc(grpc, 2)
        stats_http = http.get_inference_statistics("add_sub", "1")["model_stats"][0]
        stats_grpc = grpc.get_inference_statistics("add_sub", "1", as_json=True)["model_stats"][0]
        everything = http.get_inference_statistics()["model_stats"]
    finally:
        http.close()
        grpc.close()
    assert stats_http["inference_count"] - before["inference_count"] == 22
    assert stats_http["execution_count"] - before["execution_count"] == 6
    success = (
        stats_http["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"]
    )
    assert success == 6
    assert (
        stats_http["inference_stats"]["queue"]["count"] == stats_http["inference_stats"]["success"]["count"]
    )
    assert stats_http["last_inference"] > 0
    # Triton's fields in Triton's order (response_stats empty, as its Python backend leaves it).
    fields = ["inference_stats", "response_stats", "batch_stats", "memory_usage"]
    assert [field for field in stats_http if field in fields] == fields and stats_http["response_stats"] == {}
    # gRPC's JSON writes 64-bit numbers as strings.
    assert int(stats_grpc["inference_count"]) == stats_http["inference_count"]
    assert int(stats_grpc["execution_count"]) == stats_http["execution_count"]
    sizes = {entry["batch_size"]: entry for entry in stats_http["batch_stats"]}
    before_sizes = {entry["batch_size"]: entry for entry in before["batch_stats"]}
    assert (
        sizes[4]["compute_infer"]["count"]
        - before_sizes.get(4, {"compute_infer": {"count": 0}})["compute_infer"]["count"]
        == 5
    )
    assert {s["name"] for s in everything} == {"add_sub", "strings"}


def test_statistics_of_unknown_models(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        # Triton's words and status (400), with our reason after them.
        with pytest.raises(
            InferenceServerException,
            match=r"requested model 'nope' is not available \(Request for unknown model: 'nope' is not found\)",
        ) as info:
            client.get_inference_statistics("nope")
        assert info.value.status() == "400"
        with pytest.raises(
            InferenceServerException, match="requested model version is not available for model 'add_sub'"
        ) as info:
            client.get_inference_statistics("add_sub", "9")
        assert info.value.status() == "400"
    finally:
        client.close()


def test_metrics_can_be_turned_off(coreserve_server, tmp_path: Path) -> None:
    write_model(tmp_path, "add_sub", add_sub_model("FP32", ["batch", 4]), ADD_SUB)
    server = coreserve_server(tmp_path, "--allow-metrics=false")
    assert "Metrics" not in server.ports and "Started MetricsService" not in server.log
