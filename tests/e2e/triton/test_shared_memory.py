"""System shared memory with the unchanged tritonclient tools, over HTTP and gRPC.

The flow of Triton's simple_http_shm_client / simple_grpc_shm_client: create segments with
`tritonclient.utils.shared_memory`, register them, infer with inputs and outputs in shared
memory, read the outputs from the segment, unregister. Then the client mistakes (each a 400 /
INVALID_ARGUMENT naming the region, no traceback in the server's log), a region unregistered
while a request uses it, the CUDA endpoints on a machine without a GPU path, and server
metadata's extension list (every extension it names answers).
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from coreserve.server.shared_memory._cuda import load_cuda_runtime
from coreserve.testing import ServerProcess
from support.model_builders import add_sub_model, write_model
from support.paths import EXAMPLES
from support.waiting import wait_until

BYTE_SIZE = 64  # one INT32 [1, 16] tensor
# The server offers CUDA shared memory exactly where this probe finds a usable CUDA device.
GPU = load_cuda_runtime() is not None
needs_gpu = pytest.mark.skipif(not GPU, reason="no CUDA: no CUDA device (the CUDA runtime and an NVIDIA GPU)")
without_gpu = pytest.mark.skipif(GPU, reason="a CUDA device is usable here: the GPU path answers instead")
SLOW_MODEL = """
import time
from pathlib import Path

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        Path({marker!r}).touch()  # the test unregisters the regions once the model runs
        time.sleep(2.0)
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() + 1)]
            )
            for r in requests
        ]
"""
SLOW_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1, 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1, 16 ] } ]
"""


@pytest.fixture(scope="module")
def marker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("marker") / "slow-model-running"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, marker: Path) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("repository")
    write_model(repository, "simple", add_sub_model("INT32", ["batch", 16]), "max_batch_size: 8\n")
    shutil.copytree(EXAMPLES / "simple_string", repository / "simple_string")
    folder = write_model(repository, "slow", None, SLOW_CONFIG)
    (folder / "1" / "model.py").write_text(SLOW_MODEL.format(marker=str(marker)))
    process = ServerProcess([repository]).start()
    yield process
    process.close()


@pytest.fixture(autouse=True)
def no_traceback(server: ServerProcess) -> Iterator[None]:
    """Every test leaves the server serving, with no traceback in its log and no region left."""
    yield
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        assert client.is_server_ready()
        client.unregister_system_shared_memory()
    finally:
        client.close()
    assert "Traceback" not in server.log


class Segment:
    """A POSIX shared-memory segment of the test's, removed when the test ends."""

    def __init__(self, byte_size: int) -> None:
        self.key = f"/coreserve-test-{uuid.uuid4().hex[:12]}"
        self.handle = shm.create_shared_memory_region(self.key[1:], self.key, byte_size)

    def write(self, *arrays: np.ndarray, offset: int = 0) -> None:
        shm.set_shared_memory_region(self.handle, list(arrays), offset=offset)

    def read(self, shape: list[int], offset: int = 0, dtype: Any = np.int32) -> np.ndarray:
        return shm.get_contents_as_numpy(self.handle, dtype, shape, offset=offset)

    def destroy(self) -> None:
        shm.destroy_shared_memory_region(self.handle)


@pytest.fixture
def segments() -> Iterator[Callable[[int], Segment]]:
    made: list[Segment] = []

    def make(byte_size: int) -> Segment:
        made.append(Segment(byte_size))
        return made[-1]

    yield make
    for segment in made:
        segment.destroy()


def _values() -> tuple[np.ndarray, np.ndarray]:
    return np.arange(16, dtype=np.int32).reshape(1, 16), np.full((1, 16), 3, dtype=np.int32)


def _http_request(server: ServerProcess, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://{server.http_url}{path}", data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read()
            return response.status, json.loads(text) if text else None
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_tritonclient_shared_memory_flow(
    server: ServerProcess, segments: Callable[[int], Segment], protocol: str
) -> None:
    """Triton's simple_*_shm_client: inputs and outputs in shared memory, read back from the segment."""
    module: Any = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    inputs_segment, outputs_segment = segments(2 * BYTE_SIZE), segments(2 * BYTE_SIZE)
    input0, input1 = _values()
    inputs_segment.write(input0, input1)
    try:
        client.register_system_shared_memory("input_data", inputs_segment.key, 2 * BYTE_SIZE)
        client.register_system_shared_memory("output_data", outputs_segment.key, 2 * BYTE_SIZE)
        tensors = [
            module.InferInput("INPUT0", [1, 16], "INT32"),
            module.InferInput("INPUT1", [1, 16], "INT32"),
        ]
        tensors[0].set_shared_memory("input_data", BYTE_SIZE)
        tensors[1].set_shared_memory("input_data", BYTE_SIZE, offset=BYTE_SIZE)
        outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
        outputs[0].set_shared_memory("output_data", BYTE_SIZE)
        outputs[1].set_shared_memory("output_data", BYTE_SIZE, offset=BYTE_SIZE)

        result = client.infer("simple", tensors, outputs=outputs)

        assert [output["name"] if protocol == "http" else output.name for output in _outputs(result)] == [
            "OUTPUT0",
            "OUTPUT1",
        ]
        np.testing.assert_array_equal(outputs_segment.read([1, 16]), input0 + input1)
        np.testing.assert_array_equal(outputs_segment.read([1, 16], offset=BYTE_SIZE), input0 - input1)
        # The region is read at each request: new data, new answer, same registration.
        inputs_segment.write(input0 * 10, input1)
        client.infer("simple", tensors, outputs=outputs)
        np.testing.assert_array_equal(outputs_segment.read([1, 16]), input0 * 10 + input1)
        # An output not in shared memory comes back on the wire beside one that is.
        result = client.infer("simple", tensors, outputs=[outputs[0], module.InferRequestedOutput("OUTPUT1")])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), input0 * 10 - input1)

        status = client.get_system_shared_memory_status()
        keys = {outputs_segment.key, inputs_segment.key}
        if protocol == "http":
            assert {region["key"] for region in status} == keys
        else:
            assert {region.key for region in status.regions.values()} == keys
        client.unregister_system_shared_memory("input_data")
        client.unregister_system_shared_memory("output_data")
        status = client.get_system_shared_memory_status()
        assert (status if protocol == "http" else list(status.regions)) == []
    finally:
        client.close()


def _outputs(result: Any) -> list[Any]:
    response = result.get_response()
    return response["outputs"] if isinstance(response, dict) else list(response.outputs)


def test_status_answers_as_triton(server: ServerProcess, segments: Callable[[int], Segment]) -> None:
    segment = segments(4096)
    body = {"key": segment.key, "offset": 128, "byte_size": 256}
    assert _http_request(server, "POST", "/v2/systemsharedmemory/region/r1/register", body) == (200, None)
    assert _http_request(
        server, "POST", "/v2/systemsharedmemory/region/r2/register", {**body, "offset": 0}
    ) == (
        200,
        None,
    )
    one = {"name": "r1", "key": segment.key, "offset": 128, "byte_size": 256}
    assert _http_request(server, "GET", "/v2/systemsharedmemory/region/r1/status") == (200, [one])
    status, regions = _http_request(server, "GET", "/v2/systemsharedmemory/status")
    assert status == 200 and sorted(regions, key=lambda r: r["name"]) == [
        one,
        {**one, "name": "r2", "offset": 0},
    ]
    assert _http_request(server, "GET", "/v2/systemsharedmemory/region/nope/status") == (
        404,
        {"error": "Unable to find system shared memory region: 'nope'"},
    )
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        status_message = grpc.get_system_shared_memory_status("r1")
        assert status_message.regions["r1"].offset == 128 and status_message.regions["r1"].byte_size == 256
        with pytest.raises(InferenceServerException) as info:
            grpc.get_system_shared_memory_status("nope")
        assert info.value.status() == "StatusCode.NOT_FOUND" and "'nope'" in info.value.message()
        grpc.unregister_system_shared_memory("r1")
    finally:
        grpc.close()
    # Unregistering an unknown name is no error, as in Triton.
    assert _http_request(server, "POST", "/v2/systemsharedmemory/region/r1/unregister") == (200, None)
    assert _http_request(server, "POST", "/v2/systemsharedmemory/unregister") == (200, None)
    assert _http_request(server, "GET", "/v2/systemsharedmemory/status") == (200, [])


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("unknown key", "no shared memory segment"),
        ("name in use", "already in manager"),
        (
            "past the end",
            "failed to register shared memory region 'bad': invalid args: offset 0 + byte_size 1025",
        ),  # Triton's words first
        ("offset past the end", "past the end of segment"),
        ("key with a path", "is not a POSIX shared memory name"),
        ("key /etc/passwd", "is not a POSIX shared memory name"),
        ("key ..", "is not a POSIX shared memory name"),
    ],
)
def test_bad_registrations_are_refused_naming_the_region(
    server: ServerProcess, segments: Callable[[int], Segment], case: str, expected: str
) -> None:
    segment = segments(1024)
    key, offset, byte_size = segment.key, 0, 512
    if case == "unknown key":
        key = f"/coreserve-test-missing-{uuid.uuid4().hex[:8]}"
    elif case == "name in use":
        http = httpclient.InferenceServerClient(server.http_url)
        http.register_system_shared_memory("bad", segment.key, 64)
        http.close()
    elif case == "past the end":
        byte_size = 1025
    elif case == "offset past the end":
        offset = 1000
    elif case == "key with a path":
        key = f"../{segment.key[1:]}"
    elif case == "key /etc/passwd":
        key = "/etc/passwd"
    else:
        key = "/.."
    for protocol in ("http", "grpc"):
        module: Any = httpclient if protocol == "http" else grpcclient
        client = module.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
        try:
            with pytest.raises(InferenceServerException) as info:
                client.register_system_shared_memory("bad", key, byte_size, offset=offset)
        finally:
            client.close()
        # As Triton's: a name in use is ALREADY_EXISTS over gRPC, and 400 over HTTP as every other.
        grpc_code = "ALREADY_EXISTS" if case == "name in use" else "INVALID_ARGUMENT"
        assert info.value.status() == ("400" if protocol == "http" else f"StatusCode.{grpc_code}")
        assert "'bad'" in info.value.message() and expected in info.value.message()
    http = httpclient.InferenceServerClient(server.http_url)
    try:
        registered = [region["name"] for region in http.get_system_shared_memory_status()]
    finally:
        http.close()
    assert registered == (["bad"] if case == "name in use" else [])


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("input past the region", "Invalid offset + byte size for shared memory region: 'in'"),
        (  # Triton's QA test_too_big_shm: Triton's words, then the region
            "input of the wrong size",
            "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for model 'simple'. "
            "Expected 64, got 32 (shared_memory_byte_size in shared memory region 'in'",
        ),
        ("output too small", "should be at least 64 bytes to hold the results (shared memory region 'out')"),
        ("output past the region", "Invalid offset + byte size for shared memory region: 'out'"),
        ("output offset past the region", "Invalid offset for shared memory region: 'out'"),  # Triton's QA
        ("unknown region", "Unable to find shared memory region: 'nowhere'"),
    ],
)
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_tensors_that_do_not_fit_their_region_are_refused(
    server: ServerProcess, segments: Callable[[int], Segment], protocol: str, case: str, expected: str
) -> None:
    module: Any = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    inputs_segment, outputs_segment = segments(2 * BYTE_SIZE), segments(2 * BYTE_SIZE)
    inputs_segment.write(*_values())
    try:
        client.register_system_shared_memory("in", inputs_segment.key, 2 * BYTE_SIZE)
        client.register_system_shared_memory("out", outputs_segment.key, 2 * BYTE_SIZE)
        tensors = [
            module.InferInput("INPUT0", [1, 16], "INT32"),
            module.InferInput("INPUT1", [1, 16], "INT32"),
        ]
        tensors[0].set_shared_memory("in", BYTE_SIZE)
        tensors[1].set_shared_memory("in", BYTE_SIZE, offset=BYTE_SIZE)
        output = module.InferRequestedOutput("OUTPUT0")
        output.set_shared_memory("out", BYTE_SIZE)
        if case == "input past the region":
            tensors[1].set_shared_memory("in", BYTE_SIZE, offset=BYTE_SIZE + 4)
        elif case == "input of the wrong size":
            tensors[0].set_shared_memory("in", 32)
        elif case == "output too small":
            output.set_shared_memory("out", 32)
        elif case == "output past the region":
            output.set_shared_memory("out", BYTE_SIZE, offset=BYTE_SIZE + 1)
        elif case == "output offset past the region":
            output.set_shared_memory("out", BYTE_SIZE, offset=2 * BYTE_SIZE)
        else:
            tensors[0].set_shared_memory("nowhere", BYTE_SIZE)
        with pytest.raises(InferenceServerException) as info:
            client.infer("simple", tensors, outputs=[output])
        status = (
            {"http": "404", "grpc": "StatusCode.NOT_FOUND"}
            if case == "unknown region"
            else {
                "http": "400",
                "grpc": "StatusCode.INVALID_ARGUMENT",
            }
        )
        assert info.value.status() == status[protocol]
        assert expected in info.value.message()
    finally:
        client.close()


def _in_regions(
    client: httpclient.InferenceServerClient,
    segments: Callable[[int], Segment],
    prefix: str,
    input0: np.ndarray,
) -> tuple[Segment, Segment, httpclient.InferInput, httpclient.InferRequestedOutput]:
    """Segments for the slow model's input (holding `input0`) and output, registered as regions
    `<prefix>_in` and `<prefix>_out`, and the request's input and output naming them."""
    inputs_segment, outputs_segment = segments(BYTE_SIZE), segments(BYTE_SIZE)
    inputs_segment.write(input0)
    client.register_system_shared_memory(f"{prefix}_in", inputs_segment.key, BYTE_SIZE)
    client.register_system_shared_memory(f"{prefix}_out", outputs_segment.key, BYTE_SIZE)
    tensor = httpclient.InferInput("INPUT0", [1, 16], "INT32")
    tensor.set_shared_memory(f"{prefix}_in", BYTE_SIZE)
    output = httpclient.InferRequestedOutput("OUTPUT0")
    output.set_shared_memory(f"{prefix}_out", BYTE_SIZE)
    return inputs_segment, outputs_segment, tensor, output


def test_region_unregistered_while_a_request_uses_it(
    server: ServerProcess, segments: Callable[[int], Segment], marker: Path
) -> None:
    """The request finishes with its output in the (still mapped) region; the server serves on."""
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    input0, _ = _values()
    marker.unlink(missing_ok=True)
    results: list[Any] = []
    try:
        inputs_segment, outputs_segment, tensor, output = _in_regions(client, segments, "busy", input0)

        def infer() -> None:
            other = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
            try:
                results.append(other.infer("slow", [tensor], outputs=[output]))
            except InferenceServerException as exc:
                results.append(exc)
            finally:
                other.close()

        worker = threading.Thread(target=infer)
        worker.start()
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert marker.exists(), "the slow model never ran"
        client.unregister_system_shared_memory()  # every region, while the model runs
        assert client.get_system_shared_memory_status() == []
        worker.join(60)
        assert not worker.is_alive()
        assert not isinstance(results[0], InferenceServerException), results[0]
        np.testing.assert_array_equal(outputs_segment.read([1, 16]), input0 + 1)
        # The same segments register again and serve again.
        client.register_system_shared_memory("busy_in", inputs_segment.key, BYTE_SIZE)
        client.register_system_shared_memory("busy_out", outputs_segment.key, BYTE_SIZE)
        client.infer("slow", [tensor], outputs=[output])
        np.testing.assert_array_equal(outputs_segment.read([1, 16]), input0 + 1)
    finally:
        client.close()


def test_an_output_segment_truncated_while_the_model_runs_does_not_stop_the_server(
    server: ServerProcess, segments: Callable[[int], Segment], marker: Path
) -> None:
    """Storing through the mapping of a truncated file is SIGBUS: the output is written to the
    file instead, which grows back to hold it."""
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    input0, _ = _values()
    marker.unlink(missing_ok=True)
    try:
        _, outputs_segment, tensor, output = _in_regions(client, segments, "shrunk", input0)

        def infer() -> None:  # (a client of its own: tritonclient's HTTP client keeps to its thread)
            with httpclient.InferenceServerClient(server.http_url, network_timeout=60) as other:
                other.infer("slow", [tensor], outputs=[output])

        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(infer)
            wait_until(marker.exists, "the slow model runs", timeout=60)
            os.truncate(f"/dev/shm{outputs_segment.key}", 0)
            answer.result(timeout=60)
        with open(f"/dev/shm{outputs_segment.key}", "rb") as written:
            np.testing.assert_array_equal(np.frombuffer(written.read(), np.int32).reshape(1, 16), input0 + 1)
        assert client.is_server_live()
    finally:
        client.close()


@without_gpu
def test_cuda_shared_memory_says_this_server_has_no_gpu_path(server: ServerProcess) -> None:
    """Triton's answer where GPUs are not supported: UNSUPPORTED (501 / UNIMPLEMENTED); status is empty."""
    assert _http_request(server, "GET", "/v2/cudasharedmemory/status") == (200, [])
    status, body = _http_request(
        server,
        "POST",
        "/v2/cudasharedmemory/region/gpu0/register",
        {"raw_handle": {"b64": "AAAA"}, "device_id": 0, "byte_size": 64},
    )
    assert status == 501 and "'gpu0'" in body["error"] and "GPUs not supported" in body["error"]
    assert _http_request(server, "POST", "/v2/cudasharedmemory/unregister") == (200, None)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as info:
            grpc.register_cuda_shared_memory("gpu0", b"\0" * 64, 0, 64)
        assert (
            info.value.status() == "StatusCode.UNIMPLEMENTED" and "GPUs not supported" in info.value.message()
        )
        assert list(grpc.get_cuda_shared_memory_status().regions) == []
    finally:
        grpc.close()


@needs_gpu
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_tritonclient_cuda_shared_memory_flow(server: ServerProcess, protocol: str) -> None:
    """Triton's simple_*_cudashm_client: inputs and outputs in GPU memory the client allocated,
    shared by IPC handle; the server copies them to and from the host."""
    import tritonclient.utils.cuda_shared_memory as cudashm

    module: Any = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    inputs_region = cudashm.create_shared_memory_region("cuda_inputs", 2 * BYTE_SIZE, 0)
    outputs_region = cudashm.create_shared_memory_region("cuda_outputs", 2 * BYTE_SIZE, 0)
    input0, input1 = _values()
    try:
        cudashm.set_shared_memory_region(inputs_region, [input0, input1])
        for name, region in (("cuda_inputs", inputs_region), ("cuda_outputs", outputs_region)):
            client.register_cuda_shared_memory(name, cudashm.get_raw_handle(region), 0, 2 * BYTE_SIZE)
        tensors = [module.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
        tensors[0].set_shared_memory("cuda_inputs", BYTE_SIZE)
        tensors[1].set_shared_memory("cuda_inputs", BYTE_SIZE, offset=BYTE_SIZE)
        outputs = [module.InferRequestedOutput(name) for name in ("OUTPUT0", "OUTPUT1")]
        outputs[0].set_shared_memory("cuda_outputs", BYTE_SIZE)
        outputs[1].set_shared_memory("cuda_outputs", BYTE_SIZE, offset=BYTE_SIZE)
        client.infer("simple", tensors, outputs=outputs)
        written = cudashm.get_contents_as_numpy(outputs_region, np.int32, [2, 16])
        np.testing.assert_array_equal(written, np.concatenate([input0 + input1, input0 - input1]))

        status = client.get_cuda_shared_memory_status()
        regions = (
            {region["name"]: (region["device_id"], region["byte_size"]) for region in status}
            if protocol == "http"
            else {name: (region.device_id, region.byte_size) for name, region in status.regions.items()}
        )
        assert regions == {"cuda_inputs": (0, 2 * BYTE_SIZE), "cuda_outputs": (0, 2 * BYTE_SIZE)}
        # System and CUDA regions share one namespace, as in Triton.
        with pytest.raises(InferenceServerException, match="'cuda_inputs' already in manager"):
            client.register_system_shared_memory("cuda_inputs", "/coreserve-unused", BYTE_SIZE)
        client.unregister_cuda_shared_memory()
        status = client.get_cuda_shared_memory_status()
        assert (status if protocol == "http" else list(status.regions)) == []
    finally:
        client.close()
        cudashm.destroy_shared_memory_region(inputs_region)
        cudashm.destroy_shared_memory_region(outputs_region)


def test_server_metadata_lists_exactly_what_is_served(server: ServerProcess) -> None:
    """Each extension listed answers its own request; the ones coreserve lacks are not listed."""
    status, metadata = _http_request(server, "GET", "/v2")
    assert status == 200
    extensions = metadata["extensions"]
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    assert list(grpc.get_server_metadata().extensions) == extensions
    grpc.close()
    assert ("cuda_shared_memory" in extensions) is GPU
    infer = {
        "inputs": [
            {"name": name, "datatype": "INT32", "shape": [1, 16], "data": [1] * 16}
            for name in ("INPUT0", "INPUT1")
        ]
    }
    probes: dict[str, Callable[[], bool]] = {
        "binary_tensor_data": lambda: _binary_infer_works(server),
        "model_configuration": lambda: _http_request(server, "GET", "/v2/models/simple/config")[0] == 200,
        "statistics": lambda: _http_request(server, "GET", "/v2/models/simple/stats")[0] == 200,
        "model_repository": lambda: _http_request(server, "POST", "/v2/repository/index", {})[0] == 200,
        # (a server not in explicit mode refuses to unload, but it reads the parameter)
        "model_repository(unload_dependents)": lambda: (
            "unknown endpoint"
            not in str(
                _http_request(
                    server,
                    "POST",
                    "/v2/repository/models/nosuch/unload",
                    {"parameters": {"unload_dependents": True}},
                )
            )
        ),
        "system_shared_memory": lambda: (
            _http_request(server, "GET", "/v2/systemsharedmemory/status") == (200, [])
        ),
        "cuda_shared_memory": lambda: (
            _http_request(server, "GET", "/v2/cudasharedmemory/status") == (200, [])
        ),
        "generate": lambda: (
            _http_request(server, "POST", "/v2/models/simple/generate", {"INPUT0": [1] * 16})[0] in (200, 400)
        ),
        "logging": lambda: _http_request(server, "GET", "/v2/logging")[0] == 200,
        "trace": lambda: _http_request(server, "GET", "/v2/trace/setting")[0] == 200,
        "parameters": lambda: (
            _http_request(
                server, "POST", "/v2/models/simple/infer", {**infer, "parameters": {"custom": "x"}}
            )[0]
            == 200
        ),
        "sequence": lambda: (
            _http_request(
                server, "POST", "/v2/models/simple/infer", {**infer, "parameters": {"sequence_id": 0}}
            )[0]
            == 200
        ),
        "schedule_policy": lambda: (
            _http_request(
                server,
                "POST",
                "/v2/models/simple/infer",
                {**infer, "parameters": {"priority": 0, "timeout": 0}},
            )[0]
            == 200
        ),
        "classification": lambda: (
            _http_request(
                server,
                "POST",
                "/v2/models/simple/infer",
                {**infer, "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 1}}]},
            )[0]
            == 200
        ),
    }
    unprobed = [name for name in extensions if name not in probes]
    assert not unprobed, f"listed but not probed here (add a probe): {unprobed}"
    failing = [name for name in extensions if not probes[name]()]
    assert not failing, f"listed but not served: {failing}"


def _binary_infer_works(server: ServerProcess) -> bool:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        tensors = [httpclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
        for tensor, values in zip(tensors, _values(), strict=True):
            tensor.set_data_from_numpy(values, binary_data=True)
        result = client.infer("simple", tensors)
        return bool((result.as_numpy("OUTPUT0") == _values()[0] + 3).all())
    finally:
        client.close()


def test_no_segment_is_left_open_by_the_server(
    server: ServerProcess, segments: Callable[[int], Segment]
) -> None:
    """The server never creates or unlinks segments: the client's stays, and goes when the client removes it."""
    segment = segments(BYTE_SIZE)
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        client.register_system_shared_memory("mine", segment.key, BYTE_SIZE)
        client.unregister_system_shared_memory("mine")
    finally:
        client.close()
    assert os.path.exists(f"/dev/shm{segment.key}")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bytes_tensors_in_shared_memory(
    server: ServerProcess, segments: Callable[[int], Segment], protocol: str
) -> None:
    """Triton's simple_*_shm_string_client: BYTES inputs and outputs in their serialized form."""
    module: Any = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    input0 = np.array([[str(i).encode() for i in range(16)]], dtype=np.object_)
    input1 = np.array([[b"1"] * 16], dtype=np.object_)
    serialized = [serialize_byte_tensor(array).item() for array in (input0, input1)]
    inputs_segment, outputs_segment = segments(sum(map(len, serialized))), segments(2 * 512)
    inputs_segment.write(*(np.frombuffer(data, np.uint8) for data in serialized))
    try:
        client.register_system_shared_memory("strings_in", inputs_segment.key, sum(map(len, serialized)))
        client.register_system_shared_memory("strings_out", outputs_segment.key, 2 * 512)
        tensors = [module.InferInput(name, [1, 16], "BYTES") for name in ("INPUT0", "INPUT1")]
        tensors[0].set_shared_memory("strings_in", len(serialized[0]))
        tensors[1].set_shared_memory("strings_in", len(serialized[1]), offset=len(serialized[0]))
        outputs = [module.InferRequestedOutput(name) for name in ("OUTPUT0", "OUTPUT1")]
        outputs[0].set_shared_memory("strings_out", 512)
        outputs[1].set_shared_memory("strings_out", 512, offset=512)
        client.infer("simple_string", tensors, outputs=outputs)
        sums = outputs_segment.read([1, 16], dtype=np.object_)
        differences = outputs_segment.read([1, 16], offset=512, dtype=np.object_)
        assert [int(value) for value in sums.ravel()] == [i + 1 for i in range(16)]
        assert [int(value) for value in differences.ravel()] == [i - 1 for i in range(16)]
    finally:
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_drives_system_shared_memory(
    server: ServerProcess, perf_analyzer: Path, protocol: str
) -> None:
    command = [
        str(perf_analyzer),
        *("-m", "simple", "-i", protocol, "-u", server.http_url if protocol == "http" else server.grpc_url),
        *("--shared-memory", "system", "--output-shared-memory-size", "64"),
        *("--concurrency-range", "2", "--measurement-interval", "1000", "--max-trials", "10"),
        *("--stability-percentage", "100"),
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "Successful request count" in run.stdout


def test_grpc_stream_writes_outputs_into_shared_memory(
    server: ServerProcess, segments: Callable[[int], Segment]
) -> None:
    """ModelStreamInfer takes the same shared-memory tensors as ModelInfer."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inputs_segment, outputs_segment = segments(2 * BYTE_SIZE), segments(BYTE_SIZE)
    input0, input1 = _values()
    inputs_segment.write(input0, input1)
    answers: queue.Queue[Any] = queue.Queue()
    try:
        client.register_system_shared_memory("stream_in", inputs_segment.key, 2 * BYTE_SIZE)
        client.register_system_shared_memory("stream_out", outputs_segment.key, BYTE_SIZE)
        tensors = [grpcclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
        tensors[0].set_shared_memory("stream_in", BYTE_SIZE)
        tensors[1].set_shared_memory("stream_in", BYTE_SIZE, offset=BYTE_SIZE)
        fits, too_small = (
            grpcclient.InferRequestedOutput("OUTPUT0"),
            grpcclient.InferRequestedOutput("OUTPUT0"),
        )
        fits.set_shared_memory("stream_out", BYTE_SIZE)
        too_small.set_shared_memory("stream_out", 32)
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        client.async_stream_infer("simple", tensors, outputs=[fits], request_id="1")
        client.async_stream_infer("simple", tensors, outputs=[too_small], request_id="2")
        first, second = answers.get(timeout=60), answers.get(timeout=60)
        client.stop_stream()
        assert first[1] is None and first[0].get_response().id == "1"
        np.testing.assert_array_equal(outputs_segment.read([1, 16]), input0 + input1)
        assert second[0] is None and "region 'stream_out'" in second[1].message()
    finally:
        client.close()
