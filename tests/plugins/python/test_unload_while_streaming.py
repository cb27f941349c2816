"""Unloading a decoupled model that still answers a request after its execute() returned: as on
Triton, the model stays until its last response is sent, and only then runs finalize()."""

from __future__ import annotations

import queue
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from coreserve.testing import ServerProcess

# Answers from a thread of its own, after execute() returned; finalize() says how many requests
# it still answered then.
STREAMER = """
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.open = 0
        self.lock = threading.Lock()

    def execute(self, requests):
        for request in requests:
            with self.lock:
                self.open += 1
            threading.Thread(target=self.answer, args=(request.get_response_sender(),)).start()
        return None

    def answer(self, sender):
        for value in range(3):
            time.sleep(0.4)
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([value], np.int32))]))
        with self.lock:
            self.open -= 1
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        pb_utils.Logger.log_info(f"finalize with {self.open} requests open")
"""
CONFIG = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    (tmp_path / "streamer" / "1").mkdir(parents=True)
    (tmp_path / "streamer" / "config.pbtxt").write_text(CONFIG)
    (tmp_path / "streamer" / "1" / "model.py").write_text(STREAMER)
    process = ServerProcess([tmp_path], ["--model-control-mode=explicit", "--load-model=streamer"])
    process.start(timeout=120)
    yield process
    process.close()


def test_an_unload_waits_for_the_last_response_before_finalize(server: ServerProcess) -> None:
    results: queue.Queue = queue.Queue()
    stream = grpcclient.InferenceServerClient(server.grpc_url)
    stream.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        tensor = grpcclient.InferInput("IN", [1], "INT32")
        tensor.set_data_from_numpy(np.array([1], np.int32))
        stream.async_stream_infer("streamer", [tensor], enable_empty_final_response=True)
        first, error = results.get(timeout=30)
        assert error is None
        with httpclient.InferenceServerClient(server.http_url, network_timeout=60) as control:
            control.unload_model("streamer")  # while two responses are still to come
        values = [first.as_numpy("OUT").tolist()]
        while True:
            result, error = results.get(timeout=30)
            assert error is None
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
            values.append(result.as_numpy("OUT").tolist())
    finally:
        stream.stop_stream()
        stream.close()
    assert values == [[0], [1], [2]]
    assert re.findall(r"finalize with (\d+) requests open", server.log) == [
        "0"
    ]  # (the unload returned after it)
