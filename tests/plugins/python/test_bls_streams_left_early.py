"""A model that leaves a decoupled BLS stream before its final response (a `break`, with or
without `cancel()`): what is still due is let go, and the shared memory of its large responses
goes back to the server. It used to be kept for good: a descriptor, a mapping and a /dev/shm
file in the server per unread response, until the server ran out of descriptors."""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient

from coreserve.testing import ServerProcess

# Sends N responses of 128 KiB each (past what travels inline: they go through shared memory).
BIG_STREAM = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            sender = request.get_response_sender()
            for value in range(count):
                data = np.full(32768, value, np.int32)
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("DATA", data)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
# Reads `READ` responses of a 4-response stream (all: 4 or more), then leaves it; says how
# many it read and the sum of their first values.
CALLER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            read = int(pb_utils.get_input_tensor_by_name(request, "READ").as_numpy()[0])
            cancel = bool(pb_utils.get_input_tensor_by_name(request, "CANCEL").as_numpy()[0])
            call = pb_utils.InferenceRequest(
                model_name="big_stream",
                inputs=[pb_utils.Tensor("N", np.array([4], np.int32))],
                requested_output_names=["DATA"],
            )
            got, total = 0, 0
            stream = call.exec(decoupled=True)
            for response in stream:
                data = pb_utils.get_output_tensor_by_name(response, "DATA")
                if data is None:
                    continue  # (the empty final one)
                got, total = got + 1, total + int(data.as_numpy()[0])
                if got == read:
                    if cancel:
                        stream.cancel()
                    break
            out = np.array([got, total], np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
        return responses
"""


def _config(inputs: str, output: str, decoupled: bool) -> str:
    policy = "model_transaction_policy { decoupled: true }\n" if decoupled else ""
    return f'backend: "python"\nmax_batch_size: 0\ninput [ {inputs} ]\noutput [ {output} ]\n{policy}'


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("bls-left-early")
    int1 = "data_type: TYPE_INT32 dims: [ 1 ]"
    for name, source, config in (
        (
            "big_stream",
            BIG_STREAM,
            _config(
                f'{{ name: "N" {int1} }}', '{ name: "DATA" data_type: TYPE_INT32 dims: [ 32768 ] }', True
            ),
        ),
        (
            "caller",
            CALLER,
            _config(
                f'{{ name: "READ" {int1} }}, {{ name: "CANCEL" data_type: TYPE_BOOL dims: [ 1 ] }}',
                '{ name: "OUT" data_type: TYPE_INT32 dims: [ 2 ] }',
                False,
            ),
        ),
    ):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(config)
        (root / name / "1" / "model.py").write_text(source)
    process = ServerProcess([root]).start(timeout=120)
    yield process
    process.close()


def _call(client: httpclient.InferenceServerClient, read: int, cancel: bool) -> list[int]:
    inputs = [httpclient.InferInput("READ", [1], "INT32"), httpclient.InferInput("CANCEL", [1], "BOOL")]
    inputs[0].set_data_from_numpy(np.array([read], np.int32))
    inputs[1].set_data_from_numpy(np.array([cancel]))
    return client.infer("caller", inputs).as_numpy("OUT").tolist()


def _descriptors(server: ServerProcess) -> int:
    assert server.process is not None
    return len(os.listdir(f"/proc/{server.process.pid}/fd"))


def _shm_files() -> int:
    return sum(1 for name in os.listdir("/dev/shm") if name.startswith("coreserve-"))


@pytest.mark.parametrize("cancel", [False, True], ids=["break", "cancel-and-break"])
def test_a_stream_left_early_gives_its_memory_back(server: ServerProcess, cancel: bool) -> None:
    with httpclient.InferenceServerClient(server.http_url, network_timeout=60) as client:
        assert _call(client, 4, False) == [4, 0 + 1 + 2 + 3]  # read to the end
        descriptors, files = _descriptors(server), _shm_files()
        for _ in range(40):
            assert _call(client, 1, cancel) == [1, 0]
        assert _call(client, 4, False) == [4, 6]  # and the next stream is whole
    # Three responses of 128 KiB went unread each time: 120 kept before (a descriptor and a
    # file each); what remains is the pools' few segments, which later calls reuse.
    assert _descriptors(server) - descriptors < 12
    assert _shm_files() - files < 12
