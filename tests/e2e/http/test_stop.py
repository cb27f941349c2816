"""HTTP connections while the server stops (SIGTERM): an idle keep-alive connection is closed at
once, a busy one gets its answer and is closed after it, and the stop waits for neither client.

Triton 2.51 differs here, on purpose not followed: it keeps every HTTP connection open until its
client closes it ("Timeout N: Found 2 HTTP service connections"), so one idle keep-alive
client holds the stop for all of --exit-timeout-secs, after which it exits 1.
"""

from __future__ import annotations

import http.client
import json
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from coreserve.testing import ServerProcess
from support.waiting import requests_in, wait_until

CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
# Runs until the test creates the file `release` in its folder (at most 60 s).
SLOW = """import time
from pathlib import Path

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.release = Path(args["model_repository"]) / "release"

    def execute(self, requests):
        deadline = time.monotonic() + 60
        while not self.release.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
            for r in requests
        ]
"""
BODY = json.dumps({"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1], "data": [7]}]})


def _infer(port: int) -> tuple[int, str | None, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("POST", "/v2/models/slow/infer", BODY, {"Content-Type": "application/json"})
        answer = connection.getresponse()
        return answer.status, answer.getheader("Connection"), json.loads(answer.read())
    finally:
        connection.close()


def test_idle_connections_close_at_once_and_a_busy_one_after_its_answer(tmp_path: Path) -> None:
    (tmp_path / "slow" / "1").mkdir(parents=True)
    (tmp_path / "slow" / "config.pbtxt").write_text(CONFIG)
    (tmp_path / "slow" / "1" / "model.py").write_text(SLOW)
    server = ServerProcess([tmp_path], ["--exit-timeout-secs=30"]).start(timeout=120)
    idle = http.client.HTTPConnection("127.0.0.1", server.ports["HTTP"], timeout=60)
    try:
        assert server.process is not None
        idle.request("GET", "/v2/health/live")
        assert idle.getresponse().read() == b""  # answered, and the connection kept alive
        with ThreadPoolExecutor(1) as pool:
            busy = pool.submit(_infer, server.ports["HTTP"])
            wait_until(lambda: requests_in(server.metrics_url, "slow") == 1, "the request runs")
            stopping = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            assert idle.sock is not None
            idle.sock.settimeout(10)
            assert idle.sock.recv(1) == b""  # closed by the server while the request still runs
            assert not busy.done()
            (tmp_path / "slow" / "release").touch()
            status, connection, answer = busy.result(timeout=30)
        assert (status, connection) == (200, "close")
        assert answer["outputs"][0]["data"] == [7]
        assert server.wait(timeout=30) == 0
        assert time.monotonic() - stopping < 15  # neither connection held the stop to its timeout
    finally:
        idle.close()
        server.close()
