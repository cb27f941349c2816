"""`--trace-config mode=triton`: Triton's JSON trace file, as Triton 2.51 writes it.

The shapes were taken from the real server's file (same model, same requests): a JSON array of
one-key-set objects, a model record per trace, then one object per timestamp, tensors at
TENSORS level. `summarize` reads a file the way Triton's trace summary tool reads one (entries
grouped by id, spans from named timestamps that must not run backwards).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from coreserve.testing import ServerFactory, ServerProcess
from support.model_builders import scale_model, write_bls_model, write_model
from support.wire.http_raw import request

SCALE = """
backend: "onnxruntime"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
HTTP_MARKS = [
    "HTTP_RECV_START",
    "HTTP_RECV_END",
    "REQUEST_START",
    "QUEUE_START",
    "COMPUTE_START",
    "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START",
    "COMPUTE_END",
    "REQUEST_END",
    "HTTP_SEND_START",
    "HTTP_SEND_END",
]
GRPC_MARKS = [
    "GRPC_WAITREAD_START",
    "GRPC_WAITREAD_END",
    *HTTP_MARKS[2:-2],
    "GRPC_SEND_START",
    "GRPC_SEND_END",
]
# The spans Triton's summary tool measures: (start, end); an end before its start is an error there.
SPANS = [
    ("REQUEST_START", "REQUEST_END"),
    ("QUEUE_START", "COMPUTE_START"),
    ("COMPUTE_START", "COMPUTE_END"),
    ("COMPUTE_START", "COMPUTE_INPUT_END"),
    ("COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START"),
    ("COMPUTE_OUTPUT_START", "COMPUTE_END"),
    ("HTTP_RECV_START", "HTTP_RECV_END"),
    ("HTTP_RECV_START", "HTTP_SEND_END"),
    ("HTTP_SEND_START", "HTTP_SEND_END"),
    ("GRPC_WAITREAD_START", "GRPC_WAITREAD_END"),
    ("GRPC_WAITREAD_START", "GRPC_SEND_END"),
    ("GRPC_SEND_START", "GRPC_SEND_END"),
]


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    write_model(root, "scale", scale_model(2.0), SCALE)
    return root


def _traced_server(
    coreserve_server: ServerFactory, repository: Path | list[Path], trace_file: Path, *config: str
):
    args: list[str] = []
    for entry in (f"triton,file={trace_file}", *config):
        args += ["--trace-config", entry]
    return coreserve_server(repository, *args)


def _infer_http(server: ServerProcess, values: list[float], request_id: str = "") -> None:
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": values}]}
    if request_id:
        body["id"] = request_id
    status, _, reply = request(server.http_url, "POST", "/v2/models/scale/infer", json.dumps(body).encode())
    assert status == 200, reply


def _infer_grpc(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        client.infer("scale", [tensor])
    finally:
        client.close()


def summarize(entries: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The traces of a file by id: model record, ordered timestamp names and values, tensors."""
    traces: dict[int, dict[str, Any]] = defaultdict(lambda: {"marks": [], "tensors": []})
    for entry in entries:
        trace = traces[entry["id"]]
        if "timestamps" in entry:
            assert set(entry) == {"id", "timestamps"}
            (stamp,) = entry["timestamps"]
            assert set(stamp) == {"name", "ns"} and isinstance(stamp["ns"], int)
            trace["marks"].append((stamp["name"], stamp["ns"]))
        elif "activity" in entry:
            assert set(entry) == {"id", "activity", "tensor"}
            assert set(entry["tensor"]) == {"name", "data", "shape", "dtype"}
            trace["tensors"].append(entry)
        else:
            assert set(entry) <= {"id", "model_name", "model_version", "request_id", "parent_id"}
            assert isinstance(entry["model_version"], int)
            trace["record"] = entry
    for trace_id, trace in traces.items():
        stamps = dict(trace["marks"])
        for start, end in SPANS:
            if start in stamps and end in stamps:
                assert stamps[end] >= stamps[start], (trace_id, start, end)
    return dict(traces)


def _read(path: Path) -> dict[int, dict[str, Any]]:
    return summarize(json.loads(path.read_text()))


def test_http_and_grpc_traces_have_tritons_shape(
    coreserve_server: ServerFactory, repository: Path, tmp_path: Path
) -> None:
    trace_file = tmp_path / "trace.json"
    server = _traced_server(coreserve_server, repository, trace_file, "level=TIMESTAMPS", "rate=1")
    _infer_http(server, [1, 2, 3, 4], request_id="r1")
    _infer_grpc(server)
    assert not trace_file.exists()  # log_frequency 0: written at exit, as Triton
    assert server.stop() == 0
    traces = _read(trace_file)
    assert sorted(traces) == [1, 2]
    first, second = traces[1], traces[2]
    assert first["record"] == {"id": 1, "model_name": "scale", "model_version": 1, "request_id": "r1"}
    assert [name for name, _ in first["marks"]] == HTTP_MARKS
    assert second["record"] == {"id": 2, "model_name": "scale", "model_version": 1}
    assert [name for name, _ in second["marks"]] == GRPC_MARKS
    assert first["tensors"] == [] and second["tensors"] == []
    # The file's order: receive marks, then the model record, then the rest (Triton's).
    entries = json.loads(trace_file.read_text())
    assert [set(entry) for entry in entries[:3]] == [
        {"id", "timestamps"},
        {"id", "timestamps"},
        {"id", "model_name", "model_version", "request_id"},
    ]


def test_tensors_level_records_inputs_and_outputs(
    coreserve_server: ServerFactory, repository: Path, tmp_path: Path
) -> None:
    trace_file = tmp_path / "trace.json"
    server = _traced_server(
        coreserve_server, repository, trace_file, "level=TIMESTAMPS", "level=TENSORS", "rate=1"
    )
    _infer_http(server, [1, 2, 3, 4.5])
    server.stop()
    (trace,) = _read(trace_file).values()
    assert [(t["activity"], t["tensor"]) for t in trace["tensors"]] == [
        ("TENSOR_QUEUE_INPUT", {"name": "INPUT0", "data": "1,2,3,4.5", "shape": "1,4", "dtype": "FP32"}),
        ("TENSOR_BACKEND_OUTPUT", {"name": "OUTPUT0", "data": "2,4,6,9", "shape": "1,4", "dtype": "FP32"}),
    ]


def test_rate_samples_every_nth_request_and_count_stops_and_writes(
    coreserve_server: ServerFactory, repository: Path, tmp_path: Path
) -> None:
    trace_file = tmp_path / "trace.json"
    server = _traced_server(coreserve_server, repository, trace_file, "level=TIMESTAMPS", "rate=3", "count=2")
    for index in range(9):
        _infer_http(server, [index] * 4, request_id=f"req{index}")
    # Two traces taken (requests 3 and 6 of 9), and the count, now 0, says so.
    status, _, body = request(server.http_url, "GET", "/v2/trace/setting", b"")
    assert status == 200 and json.loads(body)["trace_count"] == "0"
    # Once the count runs out Triton writes <file>.0 at once.
    numbered = Path(f"{trace_file}.0")
    assert numbered.is_file()
    traces = _read(numbered)
    assert [trace["record"]["request_id"] for trace in traces.values()] == ["req2", "req5"]
    server.stop()
    assert not trace_file.exists()


def test_log_frequency_writes_numbered_files_as_triton_names_them(
    coreserve_server: ServerFactory, repository: Path, tmp_path: Path
) -> None:
    trace_file = tmp_path / "trace.json"
    server = _traced_server(
        coreserve_server, repository, trace_file, "level=TIMESTAMPS", "rate=1", "triton,log-frequency=2"
    )
    for index in range(5):
        _infer_http(server, [index] * 4)
    assert sorted(_read(Path(f"{trace_file}.0"))) == [1, 2]
    assert sorted(_read(Path(f"{trace_file}.1"))) == [3, 4]
    assert not Path(f"{trace_file}.2").exists()
    server.stop()
    assert sorted(_read(Path(f"{trace_file}.2"))) == [5]  # the rest, at exit
    assert not trace_file.exists()


def test_tracing_turned_on_at_run_time_and_per_model(
    coreserve_server: ServerFactory, repository: Path, tmp_path: Path
) -> None:
    trace_file = tmp_path / "trace.json"
    server = _traced_server(coreserve_server, repository, trace_file)  # level OFF
    _infer_http(server, [1] * 4, request_id="untraced")
    change = json.dumps({"trace_level": ["TIMESTAMPS"], "trace_rate": "1"}).encode()
    status, _, _ = request(server.http_url, "POST", "/v2/models/scale/trace/setting", change)
    assert status == 200
    _infer_http(server, [2] * 4, request_id="traced")
    off = json.dumps({"trace_level": ["OFF"]}).encode()
    assert request(server.http_url, "POST", "/v2/models/scale/trace/setting", off)[0] == 200
    _infer_http(server, [3] * 4, request_id="untraced-again")
    server.stop()
    traces = _read(trace_file)
    assert [trace["record"]["request_id"] for trace in traces.values()] == ["traced"]


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


def test_an_ensembles_steps_are_traced_as_its_children(
    coreserve_server: ServerFactory, repository: Path, tmp_path: Path
) -> None:
    (repository / "twice" / "1").mkdir(parents=True)
    (repository / "twice" / "config.pbtxt").write_text(TWICE)
    trace_file = tmp_path / "trace.json"
    server = _traced_server(coreserve_server, repository, trace_file, "level=TIMESTAMPS", "rate=1")
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        tensor = httpclient.InferInput("IN", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        result = client.infer("twice", [tensor], request_id="pipeline")
        assert result.as_numpy("OUT").tolist() == [[4.0] * 4]
    finally:
        client.close()
    server.stop()
    traces = _read(trace_file)
    parent = next(trace for trace in traces.values() if trace["record"]["model_name"] == "twice")
    children = [trace for trace in traces.values() if trace["record"]["model_name"] == "scale"]
    assert "parent_id" not in parent["record"]
    assert [child["record"]["parent_id"] for child in children] == [parent["record"]["id"]] * 2
    # As Triton's (its QA L0_trace): the ensemble's own record has no compute marks, its steps
    # compute, between its queue start and its end.
    assert [name for name, _ in parent["marks"]] == [mark for mark in HTTP_MARKS if "COMPUTE" not in mark]
    marks = dict(parent["marks"])
    for child in children:
        stamps = dict(child["marks"])
        assert (
            marks["QUEUE_START"] <= stamps["REQUEST_START"] <= stamps["REQUEST_END"] <= marks["REQUEST_END"]
        )
    for child in children:
        assert [name for name, _ in child["marks"]] == HTTP_MARKS[2:-2]  # in-process: no frontend marks


def test_streamed_and_generate_requests_are_traced_with_their_frontend_marks(
    coreserve_server: ServerFactory, repository: Path, tmp_path: Path
) -> None:
    # The real Triton 2.51 writes, for the same requests: GRPC_WAITREAD_* and GRPC_SEND_* on each
    # ModelStreamInfer request, HTTP_RECV_* and HTTP_SEND_* on generate and generate_stream (with
    # INFER_RESPONSE_COMPLETE, which coreserve does not write); file order aside, the same names.
    trace_file = tmp_path / "trace.json"
    server = _traced_server(coreserve_server, repository, trace_file, "level=TIMESTAMPS", "rate=1")
    answers: list[object] = []
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: answers.append(error or result))
        for index in range(2):
            tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
            tensor.set_data_from_numpy(np.full((1, 4), index, np.float32))
            client.async_stream_infer("scale", [tensor], request_id=f"stream{index}")
        client.stop_stream()
    finally:
        client.close()
    assert len(answers) == 2 and all(not isinstance(a, Exception) for a in answers)
    for endpoint in ("generate", "generate_stream"):
        body = json.dumps({"id": endpoint, "INPUT0": [1, 2, 3, 4]}).encode()
        status, _, reply = request(server.http_url, "POST", f"/v2/models/scale/{endpoint}", body)
        assert status == 200 and b"OUTPUT0" in reply, reply
    server.stop()
    traces = {trace["record"]["request_id"]: trace for trace in _read(trace_file).values()}
    assert sorted(traces) == ["generate", "generate_stream", "stream0", "stream1"]
    for request_id, trace in traces.items():
        expected = GRPC_MARKS if request_id.startswith("stream") else HTTP_MARKS
        assert sorted(name for name, _ in trace["marks"]) == sorted(expected), request_id
        assert [name for name, _ in trace["marks"][:3]] == expected[:3]  # received, then started


def test_a_bls_call_given_the_requests_trace_is_traced_as_its_child(
    coreserve_server: ServerFactory, repository: Path, tmp_path: Path
) -> None:
    # As the real Triton 2.51 writes it for the same model: the call made with
    # trace=request.trace() is a trace with the request's id as parent_id and no frontend marks;
    # the call made without it is not traced at all, whatever the rate.
    write_bls_model(repository)
    trace_file = tmp_path / "trace.json"
    server = _traced_server(coreserve_server, repository, trace_file, "level=TIMESTAMPS", "rate=1")
    body = json.dumps(
        {
            "id": "b1",
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}],
        }
    ).encode()
    status, _, reply = request(server.http_url, "POST", "/v2/models/bls/infer", body)
    assert status == 200 and json.loads(reply)["outputs"][0]["data"] == [4.0, 8.0, 12.0, 16.0], reply
    server.stop()
    traces = _read(trace_file)
    assert len(traces) == 2, traces
    parent = next(trace for trace in traces.values() if trace["record"]["model_name"] == "bls")
    (child,) = [trace for trace in traces.values() if trace["record"]["model_name"] == "scale"]
    assert parent["record"] == {
        "id": parent["record"]["id"],
        "model_name": "bls",
        "model_version": 1,
        "request_id": "b1",
    }
    assert child["record"]["parent_id"] == parent["record"]["id"]
    assert [name for name, _ in parent["marks"]] == HTTP_MARKS
    assert [name for name, _ in child["marks"]] == HTTP_MARKS[2:-2]
    compute, stamps = dict(parent["marks"]), dict(child["marks"])
    assert (
        compute["COMPUTE_START"] <= stamps["REQUEST_START"] <= stamps["REQUEST_END"] <= compute["COMPUTE_END"]
    )
