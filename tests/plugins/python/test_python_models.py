"""Triton Python models (model.py) served by plugin-python, through tritonclient."""

from __future__ import annotations

import json
import queue
import shutil
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerProcess
from support.model_builders import add_sub_model, write_model

MODELS = Path(__file__).resolve().parent / "models"
ADD_SUB = """
backend: "onnxruntime"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1, 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 1, 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1, 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 1, 4 ] } ]
"""


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("python-models")
    shutil.copytree(MODELS, root, dirs_exist_ok=True)
    write_model(root, "add_sub", add_sub_model("FP32", [1, 4]), ADD_SUB)
    folder = write_model(root, "no_class", None, 'backend: "python"')
    (folder / "1" / "model.py").write_text("class Model:  # not TritonPythonModel\n    pass\n")
    folder = write_model(root, "imports", None, IMPORTS_CONFIG)
    (folder / "1" / "model.py").write_text(IMPORTS_MODEL)
    (folder / "1" / "helper.py").write_text("WORD = b'relative'\n")
    (folder / "1" / "calendar.py").write_text("WORD = b'shadowed'\n")  # installed modules come first
    (folder / "beside.py").write_text("WORD = b'beside'\n")
    folder = write_model(root, "parameters_seen", None, IMPORTS_CONFIG.replace("[ 4 ]", "[ 2 ]"))
    (folder / "1" / "model.py").write_text(PARAMETERS_MODEL)
    return root


# What a model sees of a request's parameters: its own (in Triton's compact JSON) and its timeout.
PARAMETERS_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        seen = [[r.parameters().encode(), str(r.timeout()).encode()] for r in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("WORDS", np.array(s, dtype=np.object_))]) for s in seen]
"""


# A model that imports as models for Triton's Python backend do: a module beside it, relatively
# and by name, one beside its config.pbtxt, and a standard module its folder holds a namesake of.
IMPORTS_CONFIG = """
backend: "python"
output [ { name: "WORDS" data_type: TYPE_STRING dims: [ 4 ] } ]
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
IMPORTS_MODEL = """
import calendar
import numpy as np
import triton_python_backend_utils as pb_utils
import beside
import helper
from . import helper as relative

class TritonPythonModel:
    def execute(self, requests):
        words = [relative.WORD, helper.WORD, beside.WORD, getattr(calendar, "WORD", b"stdlib")]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("WORDS", np.array(words, dtype=np.object_))])
                for _ in requests]
"""


@pytest.fixture(scope="module")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    marker = tmp_path_factory.mktemp("marker") / "finalized.txt"
    process = ServerProcess(
        [repository], ["--exit-on-error=false"], env={"CORESERVE_TEST_MARKER": str(marker)}
    )
    process.start(timeout=120)
    yield process
    process.close()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    yield client
    client.close()


def _infer(client: httpclient.InferenceServerClient, model: str, tensors: dict[str, np.ndarray], **kwargs):
    inputs = []
    for name, data in tensors.items():
        datatype = (
            "BYTES"
            if data.dtype == np.object_
            else {np.dtype(np.float32): "FP32", np.dtype(np.int32): "INT32", np.dtype(np.bool_): "BOOL"}[
                data.dtype
            ]
        )
        tensor = httpclient.InferInput(name, list(data.shape), datatype)
        tensor.set_data_from_numpy(data)
        inputs.append(tensor)
    return client.infer(model, inputs, **kwargs)


def test_add_one_with_args_and_parameters(client: httpclient.InferenceServerClient) -> None:
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    result = _infer(client, "add_one", {"INPUT0": data}, request_id="r1", parameters={"echo": "hello"})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data + 1)
    parameters = result.get_response()["parameters"]
    assert parameters["instance"].startswith("add_one_0_") and parameters["kind"] == "CPU"
    assert parameters["version"] == "1" and parameters["request_id"] == "r1" and parameters["echo"] == "hello"


def test_an_answered_request_is_in_the_statistics_at_once(server: ServerProcess) -> None:
    # The answer leaves before the execution's bookkeeping runs; the bookkeeping must still be
    # done before the server reads the client's next request, so that a client asking for the
    # statistics right after its answer finds its request counted.
    data = np.ones((1, 4), dtype=np.float32)
    http = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        before = http.get_inference_statistics("add_one")["model_stats"][0]
        for sent in range(1, 31):
            if sent % 2:
                _infer(http, "add_one", {"INPUT0": data})
                stats = http.get_inference_statistics("add_one")["model_stats"][0]
            else:
                tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
                tensor.set_data_from_numpy(data)
                grpc.infer("add_one", [tensor])
                stats = grpc.get_inference_statistics("add_one", as_json=True)["model_stats"][0]
            # (gRPC's JSON writes 64-bit numbers as strings)
            assert int(stats["execution_count"]) == before["execution_count"] + sent
            success = before["inference_stats"]["success"]["count"] + sent
            assert int(stats["inference_stats"]["success"]["count"]) == success
    finally:
        http.close()
        grpc.close()


@pytest.mark.parametrize("elements", [4, 4 * 1024 * 1024], ids=["inline", "shared-memory"])
def test_tensors_cross_inline_or_in_shared_memory(
    client: httpclient.InferenceServerClient, elements: int
) -> None:
    # Small tensors travel in the message, large ones in a shared memory segment: both arrive
    # intact, writable, and with BYTES elements beside them.
    data = np.random.default_rng(elements).normal(size=elements).astype(np.float32)
    text = np.array([b"small", b"x" * 1000], dtype=np.object_)
    for _ in range(3):  # the second and third reuse the first one's segments
        result = _infer(client, "in_place", {"INPUT0": data, "TEXT": text})
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data + 1)
        assert result.as_numpy("TEXT_OUT").tolist() == [b"SMALL", b"X" * 1000]


def test_instances_are_processes_that_run_in_parallel(server: ServerProcess) -> None:
    def call(seconds: float) -> tuple[int, np.ndarray]:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
        try:
            result = _infer(client, "slow", {"SECONDS": np.array([seconds], np.float32)})
            return int(result.as_numpy("PID")[0]), result.as_numpy("SPAN")
        finally:
            client.close()

    call(0.01)
    with ThreadPoolExecutor(2) as pool:
        [(pid_a, span_a), (pid_b, span_b)] = list(pool.map(call, [0.8, 0.8]))
    assert pid_a != pid_b  # two stub processes
    # CPU-bound Python ran in parallel: each execution began before the other ended.
    assert span_a[0] < span_b[1] and span_b[0] < span_a[1], f"one ran after the other: {span_a}, {span_b}"


def test_tokenizer_preprocessing_of_bytes(client: httpclient.InferenceServerClient) -> None:
    texts = np.array(
        [["the movie was great"], ["terrible plot, great actors and a very long review here"]],
        dtype=np.object_,
    )
    result = _infer(client, "tokenizer", {"TEXT": texts.astype(np.object_)})
    ids, mask = result.as_numpy("input_ids"), result.as_numpy("attention_mask")
    assert ids.shape == (2, 8) and ids.dtype == np.int64
    assert mask[0].tolist() == [1, 1, 1, 1, 0, 0, 0, 0] and mask[1].tolist() == [1] * 8
    assert ids[0, 3] == ids[1, 2]  # "great" gets the same id in both texts


def test_bls_calls_an_onnx_model(client: httpclient.InferenceServerClient) -> None:
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    result = _infer(client, "bls_add_sub", {"A": a, "MODEL": np.array([b"add_sub"], dtype=np.object_)})
    np.testing.assert_array_equal(result.as_numpy("SUM"), a + 1)
    assert result.as_numpy("ERROR")[0] in (b"", "")
    result = _infer(client, "bls_add_sub", {"A": a, "MODEL": np.array([b"missing_model"], dtype=np.object_)})
    assert result.as_numpy("ERROR")[0].decode() == (  # Triton's words (request_executor.cc)
        "Model missing_model - Error when running inference: Failed for execute the inference request. "
        "Model 'missing_model' is not ready."
    )
    stats = client.get_inference_statistics("add_sub")["model_stats"][0]
    assert stats["inference_count"] >= 1  # the BLS call went through add_sub's scheduler


def test_async_execute_with_concurrent_bls(client: httpclient.InferenceServerClient) -> None:
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    result = _infer(client, "bls_async", {"A": a})
    np.testing.assert_array_equal(result.as_numpy("SUM"), a + 2)
    np.testing.assert_array_equal(result.as_numpy("DIFFERENCE"), a - 2)


def test_decoupled_streaming_over_grpc(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=partial(lambda q, result, error: q.put((result, error)), results))
    try:
        for request_id, count in (("a", 3), ("b", 5)):
            tensor = grpcclient.InferInput("N", [1], "INT32")
            tensor.set_data_from_numpy(np.array([count], np.int32))
            client.async_stream_infer(
                "countdown", [tensor], request_id=request_id, enable_empty_final_response=True
            )
        received: dict[str, list[int]] = {"a": [], "b": []}
        finals = 0
        while finals < 2:
            result, error = results.get(timeout=30)
            assert error is None
            response = result.get_response()
            assert "triton_final_response" in response.parameters  # false on all but the last, as Triton
            if response.parameters["triton_final_response"].bool_param:
                finals += 1
                assert not response.outputs
                continue
            received[response.id].append(int(result.as_numpy("VALUE")[0]))
    finally:
        client.stop_stream()
        client.close()
    assert received == {"a": [3, 2, 1], "b": [5, 4, 3, 2, 1]}


def test_decoupled_streaming_over_server_sent_events(server: ServerProcess) -> None:
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/countdown/generate_stream",
        data=json.dumps({"N": 4}).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.headers["Content-Type"] == "text/event-stream; charset=utf-8"  # (Triton's)
        body = response.read().decode()
    events = [json.loads(line[len("data: ") :]) for line in body.splitlines() if line.startswith("data: ")]
    assert [event["VALUE"] for event in events] == [4, 3, 2, 1]
    assert events[0]["model_name"] == "countdown"
    # A decoupled model over the plain infer endpoint is refused with a pointer to the stream.
    status_request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/countdown/infer",
        data=json.dumps({"inputs": [{"name": "N", "shape": [1], "datatype": "INT32", "data": [2]}]}).encode(),
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(status_request, timeout=30)
    assert info.value.code == 501 and "generate_stream" in json.loads(info.value.read())["error"]


def test_generate_endpoint_serves_ordinary_models(server: ServerProcess) -> None:
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/tokenizer/generate",
        data=json.dumps({"TEXT": "hello world"}).encode(),
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        document = json.loads(response.read())
    assert document["attention_mask"] == [1, 1, 0, 0, 0, 0, 0, 0]


def test_decoupled_bls(client: httpclient.InferenceServerClient) -> None:
    result = _infer(client, "bls_countdown", {"N": np.array([4], np.int32)})
    assert result.as_numpy("VALUES").tolist() == [4, 3, 2, 1]


def test_errors_reach_the_client(client: httpclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException, match="the input is not acceptable") as info:
        _infer(client, "failing", {"MODE": np.array([b"error"], dtype=np.object_)})
    assert info.value.status() == "400"
    with pytest.raises(InferenceServerException, match="ValueError: execute raised on purpose") as info:
        _infer(client, "failing", {"MODE": np.array([b"raise"], dtype=np.object_)})
    assert info.value.status() == "500"
    result = _infer(client, "failing", {"MODE": np.array([b"fine"], dtype=np.object_)})
    assert result.as_numpy("OK").tolist() == [True]


def test_a_stub_that_dies_is_restarted(client: httpclient.InferenceServerClient) -> None:
    first = int(_infer(client, "crashing", {"CRASH": np.array([False])}).as_numpy("PID")[0])
    with pytest.raises(InferenceServerException, match="exited unexpectedly") as info:
        _infer(client, "crashing", {"CRASH": np.array([True])})
    assert info.value.status() == "500"
    deadline = time.monotonic() + 30
    while True:
        try:
            second = int(_infer(client, "crashing", {"CRASH": np.array([False])}).as_numpy("PID")[0])
            break
        except InferenceServerException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    assert second != first
    assert client.is_server_live()


def test_initialize_failure_makes_the_model_unavailable(client: httpclient.InferenceServerClient) -> None:
    assert not client.is_model_ready("broken_init")
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata("broken_init")
    assert info.value.status() == "404"
    # Triton's words: the error, then the frames of the model's code (not the stub's).
    assert "RuntimeError: the weights file is missing\n\nAt:\n" in info.value.message()
    assert "broken_init/1/model.py(3): initialize" in info.value.message()
    assert "coreserve_python" not in info.value.message()


def test_finalize_does_not_run_after_initialize_failed(server: ServerProcess) -> None:
    """As Triton's stub: finalize() may use what initialize() was to set (it ran)."""
    assert "broken_init/1/model.py(3): initialize" in server.log  # (its failure is logged by then)
    assert "broken_init finalized" not in server.log


def test_a_model_file_without_the_model_class_says_so_in_one_line(
    client: httpclient.InferenceServerClient,
) -> None:
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata("no_class")
    assert "AttributeError: module '1.model' has no attribute 'TritonPythonModel'" in info.value.message()
    assert "Traceback" not in info.value.message()  # the stub's own code is nothing to the operator


def test_a_model_sees_the_parameters_triton_gives_it(client: httpclient.InferenceServerClient) -> None:
    """sequence_id, sequence_start/end, priority and timeout are the request's own fields on
    Triton, not among its parameters; timeout() gives the timeout."""
    fields = {
        "sequence_id": 42,
        "sequence_start": True,
        "sequence_end": True,
        "priority": 1,
        "timeout": 5_000_000,
    }
    inputs = {"X": np.array([1], np.int32)}
    words = _infer(client, "parameters_seen", inputs, parameters={"s": "x", "i": 3}, **fields).as_numpy(
        "WORDS"
    )
    assert words.tolist() == [b'{"s":"x","i":3}', b"5000000"]


def test_headers_the_forward_patterns_match_reach_the_model_as_parameters(tmp_path: Path) -> None:
    """tritonserver's --http-header-forward-pattern and --grpc-header-forward-pattern: matched
    anywhere in the name, in any case; the names come in lower case."""
    folder = write_model(tmp_path, "parameters_seen", None, IMPORTS_CONFIG.replace("[ 4 ]", "[ 2 ]"))
    (folder / "1" / "model.py").write_text(PARAMETERS_MODEL)
    flags = ["--http-header-forward-pattern=^x-|priority|timeout", "--grpc-header-forward-pattern=tenant"]
    server = ServerProcess([tmp_path], flags).start()
    x = np.array([1], np.int32)
    try:
        with httpclient.InferenceServerClient(server.http_url) as http:
            headers = {"X-Tenant": "a", "Y-Other": "b"}
            seen = _infer(http, "parameters_seen", {"X": x}, parameters={"p": 1}, headers=headers)
            assert json.loads(seen.as_numpy("WORDS")[0]) == {"p": 1, "x-tenant": "a"}
            # A matched header named as a request's own field fails it: it would change how it runs.
            with pytest.raises(InferenceServerException) as refused:
                _infer(http, "parameters_seen", {"X": x}, headers={"X-Tenant": "a", "Timeout": "5"})
            assert refused.value.status() == "400"
            assert "Header 'timeout' is reserved for Triton usage and cannot be forwarded." in str(
                refused.value
            )
        with grpcclient.InferenceServerClient(server.grpc_url) as grpc:
            tensor = grpcclient.InferInput("X", [1], "INT32")
            tensor.set_data_from_numpy(x)
            # (a value with white space at its ends, as gRPC's own server takes it: it reset the stream)
            headers = {"x-tenant": "a", "my-tenant-id": " 7 ", "other": "z"}
            seen = grpc.infer("parameters_seen", [tensor], headers=headers)
            assert json.loads(seen.as_numpy("WORDS")[0]) == {"x-tenant": "a", "my-tenant-id": " 7 "}
            with pytest.raises(
                InferenceServerException, match="Header 'triton_tenant' is reserved"
            ) as refused:
                grpc.infer("parameters_seen", [tensor], headers={"triton_tenant": "a"})
            assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
            # On a stream, each request fails alike, and the stream goes on.
            answers: queue.Queue[Any] = queue.Queue()
            grpc.start_stream(
                lambda result, error: answers.put(error or result), headers={"triton_tenant": "a"}
            )
            grpc.async_stream_infer("parameters_seen", [tensor])
            answer = answers.get(timeout=30)
            assert isinstance(answer, InferenceServerException) and "is reserved for Triton usage" in str(
                answer
            )
            grpc.stop_stream()
    finally:
        server.close()


def test_a_model_imports_its_neighbours_as_on_triton(client: httpclient.InferenceServerClient) -> None:
    words = _infer(client, "imports", {"X": np.array([1], np.int32)}).as_numpy("WORDS")
    assert words.tolist() == [b"relative", b"relative", b"beside", b"stdlib"]


def test_auto_complete_config(client: httpclient.InferenceServerClient) -> None:
    config = client.get_model_config("autocomplete")
    assert config["max_batch_size"] == 4 and "dynamic_batching" in config
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [("X", "TYPE_INT32", [2])]
    result = _infer(client, "autocomplete", {"X": np.array([[1, 2]], np.int32)})
    assert result.as_numpy("DOUBLE").tolist() == [[2, 4]]


def test_finalize_runs_at_shutdown(repository: Path, tmp_path: Path) -> None:
    own_marker = tmp_path / "finalized.txt"
    process = ServerProcess(
        [repository], ["--exit-on-error=false"], env={"CORESERVE_TEST_MARKER": str(own_marker)}
    )
    process.start(timeout=120)
    try:
        assert process.process is not None
        stubs = _children(process.process.pid)
        assert len(stubs) >= 10  # one per instance of the repository's Python models
        assert process.stop() == 0
        assert own_marker.read_text() == "finalized"
        assert not [pid for pid in stubs if Path(f"/proc/{pid}").exists()]  # no stub outlives the server
    finally:
        process.close()


def _children(pid: int) -> list[int]:
    import subprocess

    table = subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True, text=True, check=True).stdout
    return [
        int(child) for child, parent in (line.split() for line in table.splitlines()) if int(parent) == pid
    ]
