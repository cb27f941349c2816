"""`--trace-config mode=opentelemetry`: spans over OTLP/HTTP, checked at a real receiver process.

The receiver (tests/e2e/observability/otlp_receiver.py) is a separate process on loopback that decodes the
exporter's `ExportTraceServiceRequest`s; the tests assert the span tree it got: the request's
`InferRequest` span, the model span under it, `queue` and `compute` under that, ensemble steps
under the ensemble's model span, and a client's W3C `traceparent` continuing the client's trace.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from coreserve.testing import ServerFactory, ServerProcess
from support.model_builders import scale_model, write_bls_model, write_model
from support.wire.http_raw import request

SCALE = """
backend: "onnxruntime"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
TWICE = """
platform: "ensemble"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "scale" model_version: -1 input_map { key: "INPUT0" value: "IN" }
    output_map { key: "OUTPUT0" value: "mid" } },
  { model_name: "scale" model_version: -1 input_map { key: "INPUT0" value: "mid" }
    output_map { key: "OUTPUT0" value: "OUT" } }
] }
"""
CLIENT_TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE_ID}-{CLIENT_SPAN_ID}-01"
BODY = json.dumps(
    {"id": "r1", "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
).encode()


class OtlpReceiver:
    """The receiver process and the spans it wrote."""

    def __init__(self, spans_file: Path) -> None:
        self.spans_file = spans_file
        receiver = Path(__file__).with_name("otlp_receiver.py")
        self.process = subprocess.Popen(
            [sys.executable, str(receiver), str(spans_file)], stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line.startswith("listening "), line
        self.url = f"http://127.0.0.1:{int(line.split()[1])}/v1/traces"

    def spans(self) -> list[dict[str, Any]]:
        if not self.spans_file.exists():
            return []
        return [json.loads(line) for line in self.spans_file.read_text().splitlines()]

    def wait_for(self, count: int, timeout: float = 30.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            spans = self.spans()
            if len(spans) >= count:
                return spans
            time.sleep(0.1)
        raise AssertionError(f"the receiver got {len(self.spans())} spans, not {count}")

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(10)
        if self.process.stdout is not None:
            self.process.stdout.close()


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[OtlpReceiver]:
    running = OtlpReceiver(tmp_path / "spans.jsonl")
    yield running
    running.close()


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    write_model(root, "scale", scale_model(2.0), SCALE)
    (root / "twice" / "1").mkdir(parents=True)
    (root / "twice" / "config.pbtxt").write_text(TWICE)
    return root


def _otel_server(coreserve_server: ServerFactory, repository: Path, receiver: OtlpReceiver, *extra: str):
    config = [
        "mode=opentelemetry",
        "level=TIMESTAMPS",
        "rate=1",
        f"opentelemetry,url={receiver.url}",
        "opentelemetry,resource=service.name=coreserve-test",
        "opentelemetry,resource=deployment.environment=e2e",
        "opentelemetry,bsp_schedule_delay=100",
        *extra,
    ]
    args = [item for entry in config for item in ("--trace-config", entry)]
    return coreserve_server(repository, *args)


def _children(spans: list[dict[str, Any]], parent: dict[str, Any]) -> list[dict[str, Any]]:
    return [span for span in spans if span["parent_span_id"] == parent["span_id"]]


def _one(spans: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (span,) = [span for span in spans if span["name"] == name]
    return span


def test_a_request_is_a_span_tree_and_continues_the_clients_trace(
    coreserve_server: ServerFactory, repository: Path, receiver: OtlpReceiver
) -> None:
    server = _otel_server(coreserve_server, repository, receiver)
    status, _, reply = request(
        server.http_url, "POST", "/v2/models/scale/infer", BODY, {"traceparent": TRACEPARENT}
    )
    assert status == 200, reply
    spans = receiver.wait_for(4)
    assert {span["trace_id"] for span in spans} == {CLIENT_TRACE_ID}
    root = _one(spans, "InferRequest")
    assert root["parent_span_id"] == CLIENT_SPAN_ID  # the client's span is the parent
    assert root["attributes"]["triton.request_id"] == "r1"
    assert root["resource"]["service.name"] == "coreserve-test"
    assert root["resource"]["deployment.environment"] == "e2e"
    assert root["events"][:2] == ["HTTP_RECV_START", "HTTP_RECV_END"]
    assert root["events"][-2:] == ["HTTP_SEND_START", "HTTP_SEND_END"]
    (model,) = _children(spans, root)
    assert model["name"] == "scale"
    assert model["attributes"]["triton.model_name"] == "scale"
    assert model["attributes"]["triton.model_version"] == 1
    assert model["attributes"]["triton.request_id"] == "r1"
    assert model["events"] == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
    phases = {span["name"]: span for span in _children(spans, model)}
    assert sorted(phases) == ["compute", "queue"]
    assert phases["compute"]["events"] == [
        "COMPUTE_START",
        "COMPUTE_INPUT_END",
        "COMPUTE_OUTPUT_START",
        "COMPUTE_END",
    ]
    # The phases nest in time: root ⊇ model ⊇ queue, compute; queue ends where compute starts.
    assert root["start"] <= model["start"] <= phases["queue"]["start"]
    assert phases["queue"]["end"] == phases["compute"]["start"]
    assert phases["compute"]["end"] <= model["end"] <= root["end"]


def test_grpc_metadata_traceparent_and_ensemble_steps(
    coreserve_server: ServerFactory, repository: Path, receiver: OtlpReceiver
) -> None:
    server = _otel_server(coreserve_server, repository, receiver)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        tensor = grpcclient.InferInput("IN", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        result = client.infer("twice", [tensor], headers={"traceparent": TRACEPARENT})
        assert result.as_numpy("OUT").tolist() == [[4.0] * 4]
    finally:
        client.close()
    # InferRequest, the ensemble's model span (as Triton's: no compute of its own, so no queue
    # and compute spans), and per step its model, queue and compute spans.
    spans = receiver.wait_for(8)
    assert len(spans) == 8
    assert {span["trace_id"] for span in spans} == {CLIENT_TRACE_ID}
    root = _one(spans, "InferRequest")
    assert root["parent_span_id"] == CLIENT_SPAN_ID
    assert root["events"][:2] == ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END"]
    (ensemble,) = _children(spans, root)
    assert ensemble["name"] == "twice"
    assert sorted(span["name"] for span in _children(spans, ensemble)) == ["scale", "scale"]
    steps = [span for span in _children(spans, ensemble) if span["name"] == "scale"]
    for step in steps:
        assert step["attributes"]["triton.parent_id"] == ensemble["attributes"]["triton.trace_id"]
        assert sorted(span["name"] for span in _children(spans, step)) == ["compute", "queue"]


def test_streams_and_generate_continue_the_clients_trace(
    coreserve_server: ServerFactory, repository: Path, receiver: OtlpReceiver
) -> None:
    server = _otel_server(coreserve_server, repository, receiver)
    answers: list[object] = []
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:  # the stream's metadata carries the traceparent of each of its requests
        client.start_stream(
            lambda result, error: answers.append(error or result), headers={"traceparent": TRACEPARENT}
        )
        tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        client.async_stream_infer("scale", [tensor], request_id="streamed")
        client.stop_stream()
    finally:
        client.close()
    assert len(answers) == 1 and not isinstance(answers[0], Exception), answers
    other_trace = "5bf92f3577b34da6a3ce929d0e0e4737"
    for endpoint in ("generate", "generate_stream"):
        body = json.dumps({"id": endpoint, "INPUT0": [1, 2, 3, 4]}).encode()
        headers = {"traceparent": f"00-{other_trace}-{CLIENT_SPAN_ID}-01"}
        status, _, reply = request(server.http_url, "POST", f"/v2/models/scale/{endpoint}", body, headers)
        assert status == 200, reply
    spans = receiver.wait_for(12)  # per request: InferRequest, the model's span, queue, compute
    roots = {
        _children(spans, root)[0]["attributes"]["triton.request_id"]: root
        for root in spans
        if root["name"] == "InferRequest"
    }
    assert sorted(roots) == ["generate", "generate_stream", "streamed"]
    assert all(root["attributes"]["triton.request_id"] == name for name, root in roots.items())
    assert roots["streamed"]["trace_id"] == CLIENT_TRACE_ID
    assert roots["streamed"]["events"] == [
        "GRPC_WAITREAD_START",
        "GRPC_WAITREAD_END",
        "GRPC_SEND_START",
        "GRPC_SEND_END",
    ]
    for endpoint in ("generate", "generate_stream"):
        assert roots[endpoint]["trace_id"] == other_trace
        assert roots[endpoint]["events"] == [
            "HTTP_RECV_START",
            "HTTP_RECV_END",
            "HTTP_SEND_START",
            "HTTP_SEND_END",
        ]
    for root in roots.values():
        assert root["parent_span_id"] == CLIENT_SPAN_ID
        (model,) = _children(spans, root)
        assert sorted(span["name"] for span in _children(spans, model)) == ["compute", "queue"]
        assert root["start"] <= model["start"] and model["end"] <= root["end"]


def test_a_bls_call_given_the_requests_trace_is_a_child_span(
    coreserve_server: ServerFactory, repository: Path, receiver: OtlpReceiver
) -> None:
    write_bls_model(repository)
    server = _otel_server(coreserve_server, repository, receiver)
    body = json.dumps(
        {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
    ).encode()
    status, _, reply = request(
        server.http_url, "POST", "/v2/models/bls/infer", body, {"traceparent": TRACEPARENT}
    )
    assert status == 200, reply
    # InferRequest, bls, its queue and compute; the traced call's scale, queue and compute. The
    # call made without trace=request.trace() is not traced (as Triton).
    spans = receiver.wait_for(7)
    time.sleep(0.5)  # (a stray span of the untraced call would arrive in the same batch)
    spans = receiver.spans()
    assert sorted(span["name"] for span in spans) == [
        "InferRequest",
        "bls",
        "compute",
        "compute",
        "queue",
        "queue",
        "scale",
    ]
    assert {span["trace_id"] for span in spans} == {CLIENT_TRACE_ID}
    root = _one(spans, "InferRequest")
    (model,) = _children(spans, root)
    assert model["name"] == "bls"
    assert sorted(span["name"] for span in _children(spans, model)) == ["compute", "queue", "scale"]
    call = _one(spans, "scale")
    assert call["attributes"]["triton.parent_id"] == model["attributes"]["triton.trace_id"]
    assert sorted(span["name"] for span in _children(spans, call)) == ["compute", "queue"]
    assert model["start"] <= call["start"] <= call["end"] <= model["end"]


def test_without_a_traceparent_each_request_starts_its_own_trace(
    coreserve_server: ServerFactory, repository: Path, receiver: OtlpReceiver
) -> None:
    server = _otel_server(coreserve_server, repository, receiver)
    for _ in range(2):
        assert request(server.http_url, "POST", "/v2/models/scale/infer", BODY)[0] == 200
    spans = receiver.wait_for(8)
    roots = [span for span in spans if span["name"] == "InferRequest"]
    assert len(roots) == 2 and all(root["parent_span_id"] == "" for root in roots)
    assert len({root["trace_id"] for root in roots}) == 2


def test_rate_zero_traces_only_requests_that_carry_a_trace_context(
    coreserve_server: ServerFactory, repository: Path, receiver: OtlpReceiver
) -> None:
    """Triton's documented use of rate=0 in OpenTelemetry mode."""
    server = _otel_server(coreserve_server, repository, receiver, "rate=0")
    assert request(server.http_url, "POST", "/v2/models/scale/infer", BODY)[0] == 200
    headers = {"traceparent": TRACEPARENT}
    assert request(server.http_url, "POST", "/v2/models/scale/infer", BODY, headers)[0] == 200
    server.stop()  # the exporter sends what it holds at exit
    spans = receiver.wait_for(4)
    assert len(spans) == 4
    assert {span["trace_id"] for span in spans} == {CLIENT_TRACE_ID}


def test_spans_left_in_the_batch_are_sent_at_exit(
    coreserve_server: ServerFactory, repository: Path, receiver: OtlpReceiver
) -> None:
    # A schedule delay far beyond the test: only the flush at exit can deliver the spans.
    server = _otel_server(coreserve_server, repository, receiver, "opentelemetry,bsp_schedule_delay=600000")
    assert request(server.http_url, "POST", "/v2/models/scale/infer", BODY)[0] == 200
    time.sleep(0.5)
    assert receiver.spans() == []
    assert server.stop() == 0
    assert len(receiver.wait_for(4)) == 4


def test_settings_answer_the_mode(
    coreserve_server: ServerFactory, repository: Path, receiver: OtlpReceiver
) -> None:
    server: ServerProcess = _otel_server(coreserve_server, repository, receiver)
    status, _, body = request(server.http_url, "GET", "/v2/trace/setting", b"")
    # Triton 2.51's keys in this mode: no trace file or log frequency, the exporter's options.
    assert status == 200 and json.loads(body) == {
        "trace_level": ["TIMESTAMPS"],
        "trace_rate": "1",
        "trace_count": "-1",
        "trace_mode": "opentelemetry",
        "url": receiver.url,
        "bsp_max_export_batch_size": "512",
        "bsp_schedule_delay": "100",
        "bsp_max_queue_size": "2048",
    }
