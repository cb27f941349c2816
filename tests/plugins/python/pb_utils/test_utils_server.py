"""pb_utils' server-side API in real model.py files served by a real server: custom metrics on
the metrics port, model management from a model, the BLS call forms, and concurrent
`async def execute` of a decoupled model. Expected texts are Triton 2.51's, taken from the
same calls in models served by the real Triton."""

from __future__ import annotations

import json
import queue
import time
import urllib.request
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerFactory, ServerProcess

# A model whose execute runs the Python of its request's CODE input and answers its result as
# JSON: one model serves every scenario below, each test sending the code it needs.
PROBE_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "CODE" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "RESULT" data_type: TYPE_STRING dims: [ 1 ] } ]
"""
PROBE_MODEL = """
import asyncio
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def attempt(fn):
    try:
        value = fn()
    except BaseException as exc:
        return {"error": type(exc).__name__, "message": str(exc)}
    return {"ok": value}


class TritonPythonModel:
    def initialize(self, args):
        self.instance = args["model_instance_name"]
        self.requests = pb_utils.MetricFamily(
            "probe_requests_total", "Requests the probe served", pb_utils.MetricFamily.COUNTER
        )
        self.counter = self.requests.Metric(labels={"model": "probe", "quote": 'say "hi"'})
        # (As on Triton, a family is kept: deleting it clears its metrics.)
        self.gauges = pb_utils.MetricFamily("probe_temperature", "A gauge", pb_utils.MetricFamily.GAUGE)
        self.gauge = self.gauges.Metric()
        self.histograms = pb_utils.MetricFamily(
            "probe_latency_seconds", "A histogram", pb_utils.MetricFamily.HISTOGRAM
        )
        self.histogram = self.histograms.Metric(labels={"k": "v"}, buckets=[0.5, 1, 2.5])

    async def run(self, code):
        scope = {"pb_utils": pb_utils, "np": np, "json": json, "self": self, "attempt": attempt, "asyncio": asyncio}
        exec("async def scenario():\\n" + "\\n".join("    " + line for line in code.splitlines()), scope)
        return await scope["scenario"]()

    async def execute(self, requests):
        responses = []
        for request in requests:
            code = pb_utils.get_input_tensor_by_name(request, "CODE").as_numpy()[0].decode()
            result = json.dumps(await self.run(code), default=repr)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("RESULT", np.array([result.encode()], dtype=np.object_))]
            ))
        return responses
"""
ECHO_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
ECHO_MODEL = """
import json
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())],
                parameters={"seen": r.parameters(), "timeout": r.timeout()},
            )
            for r in requests
        ]
"""
# Decoupled: for N, N responses (N, N-1, ..., 1) 0.05 s apart, then the final flag.
TICKER_CONFIG = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "VALUE" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
TICKER_MODEL = """
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            threading.Thread(target=self.stream, args=(request.get_response_sender(), n)).start()
        return None

    def stream(self, sender, n):
        for value in range(n, 0, -1):
            if sender.is_cancelled():
                break
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("VALUE", np.array([value], np.int32))]))
            time.sleep(0.05)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""
# Decoupled with `async def execute`: each execution waits until WANTED executions run at once
# (or 20 s pass), then answers how many it saw in flight. Run one at a time, each would see 1.
OVERLAP_CONFIG = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "WANTED" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "SEEN" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
OVERLAP_MODEL = """
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.in_flight = 0
        self.peak = 0

    async def execute(self, requests):
        request = requests[0]
        wanted = int(pb_utils.get_input_tensor_by_name(request, "WANTED").as_numpy()[0])
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        deadline = asyncio.get_running_loop().time() + 20
        while self.peak < wanted and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        self.in_flight -= 1
        sender = request.get_response_sender()
        sender.send(
            pb_utils.InferenceResponse([pb_utils.Tensor("SEEN", np.array([self.peak], np.int32))]),
            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
        )
        return None
"""


def _write(root: Path, name: str, config: str, model: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(config)
    (root / name / "1" / "model.py").write_text(model)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("pb-utils-server")
    _write(root, "probe", PROBE_CONFIG, PROBE_MODEL)
    _write(root, "echo", ECHO_CONFIG, ECHO_MODEL)
    _write(root, "ticker", TICKER_CONFIG, TICKER_MODEL)
    _write(root, "overlap", OVERLAP_CONFIG, OVERLAP_MODEL)
    process = ServerProcess(
        [root],
        ["--model-control-mode=explicit", *(f"--load-model={m}" for m in ("probe", "ticker", "overlap"))],
    )
    process.start(timeout=120)
    yield process
    process.close()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    yield client
    client.close()


def _run(client: httpclient.InferenceServerClient, code: str, model: str = "probe") -> object:
    """Runs `code` (the body of an async function) in the probe model; its return value."""
    tensor = httpclient.InferInput("CODE", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([code.encode()], dtype=np.object_))
    result = client.infer(model, [tensor])
    return json.loads(result.as_numpy("RESULT")[0])


def _metrics(server: ServerProcess) -> str:
    with urllib.request.urlopen(server.metrics_url, timeout=30) as response:
        return str(response.read().decode())


def _failure(instance: str, what: str, reason: str) -> str:
    return f"{what}: Failed to process the request for model '{instance}', message: {reason}"


def test_custom_metrics_are_exported_beside_the_servers(
    server: ServerProcess, client: httpclient.InferenceServerClient
) -> None:
    result = _run(
        client,
        """
self.counter.increment(2)
self.counter.increment(1.5)
self.gauge.set(-3.5)
self.gauge.increment(-1)
self.histogram.observe(0.7)
self.histogram.observe(3)
return [self.counter.value(), self.gauge.value()]
""",
    )
    assert result == [3.5, -4.5]
    text = _metrics(server)
    assert (
        "# HELP probe_requests_total Requests the probe served\n# TYPE probe_requests_total counter\n" in text
    )
    assert 'probe_requests_total{model="probe",quote="say \\"hi\\""} 3.5\n' in text
    assert "# TYPE probe_temperature gauge\nprobe_temperature -4.5\n" in text
    assert (
        "# TYPE probe_latency_seconds histogram\n"
        'probe_latency_seconds_count{k="v"} 2\n'
        'probe_latency_seconds_sum{k="v"} 3.7\n'
        'probe_latency_seconds_bucket{k="v",le="0.5"} 0\n'
        'probe_latency_seconds_bucket{k="v",le="1"} 1\n'
        'probe_latency_seconds_bucket{k="v",le="2.5"} 1\n'
        'probe_latency_seconds_bucket{k="v",le="+Inf"} 2\n'
    ) in text
    assert 'nv_inference_count{model="probe",version="1"}' in text  # the server's families stay


def test_custom_metric_mistakes_raise_as_on_triton(client: httpclient.InferenceServerClient) -> None:
    result = _run(
        client,
        """
family = pb_utils.MetricFamily
checks = {
    "bad_name": lambda: family("bad name!", "d", family.COUNTER),
    "bad_kind": lambda: family("x_kind", "d", 7),
    "other_kind": lambda: family("probe_requests_total", "d", family.GAUGE),
    "same_again": lambda: (lambda kept: kept.Metric(labels={"model": "probe", "quote": 'say "hi"'}).value() >= 0)(
        family("probe_requests_total", "d", family.COUNTER)),
    "int_label": lambda: self.requests.Metric(labels={"a": 1}),
    "counter_buckets": lambda: self.requests.Metric(labels={"a": "2"}, buckets=[1.0]),
    "negative": lambda: self.counter.increment(-1),
    "counter_set": lambda: self.counter.set(5),
    "counter_observe": lambda: self.counter.observe(5),
    "gauge_observe": lambda: self.gauge.observe(1),
    "histogram_no_buckets": lambda: family("probe_h2", "h", family.HISTOGRAM).Metric(labels={"c": "x"}),
    "unsorted_buckets": lambda: family("probe_h2", "h", family.HISTOGRAM).Metric(buckets=[2.0, 1.0]),
    "histogram_increment": lambda: self.histogram.increment(1),
    "histogram_set": lambda: self.histogram.set(1),
    "histogram_value": lambda: self.histogram.value(),
}
found = {name: attempt(check) for name, check in checks.items()}
found["instance"] = self.instance
return found
""",
    )
    assert isinstance(result, dict)
    instance = result.pop("instance")
    fail = partial(_failure, instance)
    exception = "TritonModelException"
    expected = {
        "bad_name": (exception, fail("Error when creating MetricFamily", "Invalid metric name")),
        "other_kind": (
            exception,
            fail("Error when creating MetricFamily", "Family name already exists with different type"),
        ),
        "int_label": (
            exception,
            fail("Error when creating Metric", "attempt to access JSON non-string as string"),
        ),
        "counter_buckets": (exception, "Failed to create metric. Unexpected buckets found."),
        "negative": (
            exception,
            fail(
                "Failed to increment metric value",
                "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by "
                "non-negative values.",
            ),
        ),
        "counter_set": (
            exception,
            fail("Failed to set metric value", "TRITONSERVER_METRIC_KIND_COUNTER does not support Set"),
        ),
        "counter_observe": (
            exception,
            fail(
                "Failed to observe metric value", "TRITONSERVER_METRIC_KIND_COUNTER does not support Observe"
            ),
        ),
        "gauge_observe": (
            exception,
            fail("Failed to observe metric value", "TRITONSERVER_METRIC_KIND_GAUGE does not support Observe"),
        ),
        "histogram_no_buckets": (exception, "Failed to create metric. Missing required buckets."),
        "unsorted_buckets": (
            exception,
            fail("Error when creating Metric", "Bucket Boundaries must be strictly sorted"),
        ),
        "histogram_increment": (
            exception,
            fail(
                "Failed to increment metric value",
                "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Increment",
            ),
        ),
        "histogram_set": (
            exception,
            fail("Failed to set metric value", "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Set"),
        ),
        "histogram_value": (
            exception,
            fail("Failed to get metric value", "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value"),
        ),
    }
    for name, (kind, message) in expected.items():
        assert result[name] == {"error": kind, "message": message}, name
    assert result["bad_kind"]["error"] == "TypeError"  # as Triton's bindings: not a MetricKind
    assert result["same_again"] == {"ok": True}  # the same name and kind: the same family


def test_a_deleted_family_takes_its_metrics_and_a_metric_still_held_refuses(
    server: ServerProcess, client: httpclient.InferenceServerClient
) -> None:
    """As Triton's (its QA custom_metrics test_metric_lifetime_error): a family whose last
    reference goes (`del`, or a temporary's) is deleted with its metrics, and a Metric still
    held then fails every operation. They used to go on, and stay on the endpoint."""
    result = _run(
        client,
        """
family = pb_utils.MetricFamily("probe_short_lived", "Short", pb_utils.MetricFamily.GAUGE)
metric = family.Metric(labels={"k": "v"})
metric.set(4)
del family
found = {name: attempt(call) for name, call in (("set", lambda: metric.set(1)),
         ("increment", lambda: metric.increment(1)), ("value", lambda: metric.value()))}
temporary = pb_utils.MetricFamily("probe_temporary", "Gone", pb_utils.MetricFamily.COUNTER).Metric()
found["temporary"] = attempt(lambda: temporary.increment(1))
return found
""",
    )
    deleted = (
        "Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The 'MetricFamily' "
        "object should be deleted AFTER its corresponding 'Metric' objects have been deleted."
    )
    assert result == {
        "set": {"error": "TritonModelException", "message": f"Failed to set metric value: {deleted}"},
        "increment": {
            "error": "TritonModelException",
            "message": f"Failed to increment metric value: {deleted}",
        },
        "value": {"error": "TritonModelException", "message": f"Failed to get metric value: {deleted}"},
        "temporary": {
            "error": "TritonModelException",
            "message": f"Failed to increment metric value: {deleted}",
        },
    }
    text = _metrics(server)
    assert "probe_short_lived" not in text and "probe_temporary" not in text
    assert "probe_temperature" in text  # the families kept stay


def test_model_management_from_a_model(
    server: ServerProcess, client: httpclient.InferenceServerClient
) -> None:
    config = json.dumps(
        {
            "backend": "python",
            "max_batch_size": 0,
            "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [1]}],
            "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [1]}],
        }
    )
    result = _run(
        client,
        f"""
config = {config!r}
source = {ECHO_MODEL.encode()!r}
found = {{"instance": self.instance}}
found["ready_before"] = attempt(lambda: pb_utils.is_model_ready("echo"))
found["bad_version"] = attempt(lambda: pb_utils.is_model_ready("echo", "x"))
found["load"] = attempt(lambda: pb_utils.load_model("echo"))
found["ready_after"] = attempt(lambda: pb_utils.is_model_ready(b"echo"))
found["ready_v1"] = attempt(lambda: pb_utils.is_model_ready("echo", "1"))
found["ready_v7"] = attempt(lambda: pb_utils.is_model_ready("echo", "7"))
found["load_missing"] = attempt(lambda: pb_utils.load_model("nope"))
found["load_files"] = attempt(lambda: pb_utils.load_model("made", config=config, files={{"file:1/model.py": source}}))
found["ready_made"] = attempt(lambda: pb_utils.is_model_ready("made"))
found["unload"] = attempt(lambda: pb_utils.unload_model(b"made"))
found["ready_unloaded"] = attempt(lambda: pb_utils.is_model_ready("made"))
found["unload_missing"] = attempt(lambda: pb_utils.unload_model("nope"))
return found
""",
    )
    assert isinstance(result, dict)
    fail = partial(_failure, result.pop("instance"))
    assert result.pop("bad_version") == {
        "error": "TritonModelException",
        "message": fail(
            "Failed to check model readiness",
            "failed to get model version from specified version string 'x' (details: stol), version "
            "should be an integral value > 0",
        ),
    }
    # Triton's text first; coreserve adds why.
    load_missing = result.pop("load_missing")
    assert load_missing["error"] == "TritonModelException"
    assert load_missing["message"].startswith(
        fail("Failed to load model", "failed to load 'nope', failed to poll from model repository")
    )
    assert result == {
        "ready_before": {"ok": False},
        "load": {"ok": None},
        "ready_after": {"ok": True},
        "ready_v1": {"ok": True},
        "ready_v7": {"ok": False},
        "load_files": {"ok": None},
        "ready_made": {"ok": True},
        "unload": {"ok": None},
        "ready_unloaded": {"ok": False},
        "unload_missing": {"ok": None},
    }
    # What the model loaded serves clients too.
    tensor = httpclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.array([4.0], np.float32))
    assert client.infer("echo", [tensor]).as_numpy("OUT").tolist() == [4.0]
    assert not client.is_model_ready("made")


def test_bls_call_forms_of_tritons_bindings(client: httpclient.InferenceServerClient) -> None:
    client.load_model("echo")
    result = _run(
        client,
        """
found = {}
inputs = [pb_utils.Tensor(b"IN", np.array([2.0], np.float32))]
request = pb_utils.InferenceRequest(
    model_name=b"echo", inputs=inputs, requested_output_names=[b"OUT"],
    timeout=10_000_000, preferred_memory=pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0),
    parameters={"tag": "t", "n": 3, "flag": True},
)
response = request.exec()
found["sync"] = response.output_tensors()[0].as_numpy().tolist()
found["parameters"] = json.loads(json.loads(response.parameters())["seen"])
found["timeout"] = json.loads(response.parameters())["timeout"]
ticker = lambda n: pb_utils.InferenceRequest(
    model_name="ticker", inputs=[pb_utils.Tensor("N", np.array([n], np.int32))], requested_output_names=["VALUE"])
iterator = ticker(3).exec(decoupled=True)
found["iterator_type"] = type(iterator).__name__
found["iterated"] = [[int(t.as_numpy()[0]) for t in r.output_tensors()] for r in iterator]
future = ticker(2).async_exec(decoupled=True)
found["async_type"] = type(await future).__name__
found["async_for"] = [[int(t.as_numpy()[0]) for t in r.output_tensors()] async for r in future.result()]
found["sync_for_after_await"] = [
    [int(t.as_numpy()[0]) for t in r.output_tensors()] for r in await ticker(2).async_exec(decoupled=True)]
found["async_single"] = (await request.async_exec()).output_tensors()[0].as_numpy().tolist()
cancelled = ticker(200).exec(decoupled=True)
first = next(cancelled)
cancelled.cancel()
found["cancelled_count"] = 1 + sum(1 for _ in cancelled)
missing = pb_utils.InferenceRequest(model_name="nope", inputs=[], requested_output_names=[]).exec()
found["missing"] = [missing.has_error(), missing.error().code() == pb_utils.TritonError.NOT_FOUND]
return found
""",
    )
    assert isinstance(result, dict)
    assert result.pop("cancelled_count") < 100  # the server stopped the call early
    assert result == {
        "sync": [2.0],
        "parameters": {"tag": "t", "n": 3, "flag": True},  # the timeout is the request's own, as on Triton
        "timeout": 10_000_000,
        "iterator_type": "ResponseIterator",
        "iterated": [[3], [2], [1], []],  # Triton ends with an empty final response
        "async_type": "ResponseIterator",
        "async_for": [[2], [1], []],
        "sync_for_after_await": [[2], [1], []],
        "async_single": [2.0],
        "missing": [True, True],
    }


def test_async_execute_of_a_decoupled_model_runs_concurrently(server: ServerProcess) -> None:
    """Three requests on one instance: each execution waits until three run at once."""
    answers: queue.Queue[object] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    try:
        for index in range(3):
            tensor = grpcclient.InferInput("WANTED", [1], "INT32")
            tensor.set_data_from_numpy(np.array([3], np.int32))
            client.async_stream_infer("overlap", [tensor], request_id=str(index))
        seen = []
        for _ in range(3):
            answer = answers.get(timeout=60)
            assert not isinstance(answer, InferenceServerException), answer
            seen.append(int(answer.as_numpy("SEEN")[0]))  # type: ignore[attr-defined]
    finally:
        client.stop_stream()
        client.close()
    assert seen == [3, 3, 3]


COUNTING_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.family = pb_utils.MetricFamily("counting_calls", "Calls", pb_utils.MetricFamily.COUNTER)
        self.calls = self.family.Metric(labels={"model": "counting"})

    def execute(self, requests):
        self.calls.increment(len(requests))
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
            for r in requests
        ]
"""


def test_custom_metrics_outlive_their_model_and_a_reload_continues_them(
    server: ServerProcess, client: httpclient.InferenceServerClient, tmp_path: Path
) -> None:
    """As Triton keeps a Python model's families when its stub ends (checked side by side)."""
    config = json.dumps(
        {
            "backend": "python",
            "max_batch_size": 0,
            "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [1]}],
            "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [1]}],
        }
    )
    files = {"file:1/model.py": COUNTING_MODEL.encode()}
    client.load_model("counting", config=config, files=files)
    tensor = httpclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.array([1.0], np.float32))
    for _ in range(3):
        client.infer("counting", [tensor])
    assert 'counting_calls{model="counting"} 3\n' in _metrics(server)
    client.unload_model("counting")  # (answered once its instance has closed)
    assert 'counting_calls{model="counting"} 3\n' in _metrics(server)
    client.load_model("counting", config=config, files=files)
    client.infer("counting", [tensor])
    assert 'counting_calls{model="counting"} 4\n' in _metrics(server)
    assert "probe_requests_total" in _metrics(server)  # other models' families as they were


def test_loading_from_a_model_needs_explicit_mode(coreserve_server: ServerFactory, tmp_path: Path) -> None:
    _write(tmp_path, "probe", PROBE_CONFIG, PROBE_MODEL)
    server = coreserve_server(tmp_path)  # --model-control-mode none
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    try:
        result = _run(
            client,
            """
return [self.instance, attempt(lambda: pb_utils.load_model("probe")),
        attempt(lambda: pb_utils.unload_model("probe")), attempt(lambda: pb_utils.is_model_ready("probe"))]
""",
        )
    finally:
        client.close()
    assert isinstance(result, list)
    instance, load, unload, ready = result
    assert load["error"] == unload["error"] == "TritonModelException"
    assert load["message"].startswith(
        _failure(instance, "Failed to load model", "explicit model load / unload is not allowed")
    )
    assert "--model-control-mode=explicit" in load["message"]
    assert unload["message"].startswith(
        _failure(instance, "Failed to unload model", "explicit model load / unload is not allowed")
    )
    assert ready == {"ok": True}
    assert server.process is not None and server.process.poll() is None  # the server keeps serving


def test_logger_levels_reach_the_server_log(
    server: ServerProcess, client: httpclient.InferenceServerClient
) -> None:
    _run(
        client,
        """
pb_utils.Logger.log("probe-says-info")
pb_utils.Logger.log("probe-says-warning", pb_utils.Logger.WARNING)
pb_utils.Logger.log_error("probe-says-error")
pb_utils.Logger.log("probe-says-level-enum", pb_utils.Logger.LogLevel.ERROR)
""",
    )
    deadline = time.monotonic() + 30
    while "probe-says-level-enum" not in server.log:
        assert time.monotonic() < deadline, "the model's log lines did not reach the server's log"
        time.sleep(0.1)
    lines = {  # (the message JSON-encoded, as Triton writes it)
        json.loads(line.split("] ", 1)[1]): line[0]
        for line in server.log.splitlines()
        if "probe-says-" in line
    }
    assert lines == {
        "probe-says-info": "I",
        "probe-says-warning": "W",
        "probe-says-error": "E",
        "probe-says-level-enum": "E",
    }
