"""BLS calls from processes a model forks in `execute` (a `multiprocessing` pool of the fork
start method), as Triton's stub serves them (its QA's BLS `test_multiprocess`). They used to
hang: the child shared the stub's socket, and the parent's reader took the child's answers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from coreserve.testing import ServerProcess
from support.waiting import wait_until

# OUT = 2 * IN.
DOUBLER = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", 2 * pb_utils.get_input_tensor_by_name(request, "IN").as_numpy())]
            )
            for request in requests
        ]
"""
# N responses: VALUE 0 .. N-1.
COUNTER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            sender = request.get_response_sender()
            for value in range(count):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("VALUE", np.array([value], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
# Each of SIZE pool tasks (SIZE elements of 40,000: past what travels inline) is doubled by a
# BLS call in a forked child, and the child also reads a decoupled stream of 3 responses; a
# grandchild whose parent makes no call makes one too. OUT: per task, the sum of its doubled values
# plus the sum of the stream's values (0 + 1 + 2); GRAND: the grandchild's answer.
FORKER = """
import multiprocessing
import os

import numpy as np
import triton_python_backend_utils as pb_utils


def _double(values):
    request = pb_utils.InferenceRequest(
        model_name="doubler", inputs=[pb_utils.Tensor("IN", values)], requested_output_names=["OUT"]
    )
    response = request.exec()
    if response.has_error():
        raise RuntimeError(response.error().message())
    return pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()


def task(seed):
    doubled = _double(np.full(40000, seed, np.int64))
    stream = pb_utils.InferenceRequest(
        model_name="counter",
        inputs=[pb_utils.Tensor("N", np.array([3], np.int32))],
        requested_output_names=["VALUE"],
    ).exec(decoupled=True)
    values = [int(pb_utils.get_output_tensor_by_name(r, "VALUE").as_numpy()[0]) for r in stream if r.output_tensors()]
    return int(doubled.sum()) + sum(values)


def grandchild():
    # A child that makes no call of its own forks one that does: its answer, through a pipe.
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        grand = os.fork()
        if grand == 0:
            os.write(write, int(_double(np.array([21], np.int64))[0]).to_bytes(8, "little"))
            os._exit(0)
        os.waitpid(grand, 0)
        os._exit(0)
    os.close(write)
    answer = int.from_bytes(os.read(read, 8), "little")
    os.close(read)
    os.waitpid(child, 0)
    return answer


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            size = int(pb_utils.get_input_tensor_by_name(request, "SIZE").as_numpy()[0])
            with multiprocessing.get_context("fork").Pool(2) as pool:
                sums = pool.map(task, range(1, size + 1))
            grand = grandchild()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", np.array(sums, np.int64)),
                pb_utils.Tensor("GRAND", np.array([grand], np.int64)),
            ]))
        return responses
"""

# Up to 100 responses, 0.05 s apart; says in the log when its request was cancelled.
TICKER = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            for value in range(100):
                if request.is_cancelled():
                    pb_utils.Logger.log_info(f"ticker cancelled after {value}")
                    break
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("VALUE", np.array([value], np.int32))]))
                time.sleep(0.05)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
# A forked child opens a stream of the ticker, reads one response and exits without a word.
LEAVER = """
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        read, write = os.pipe()
        child = os.fork()
        if child == 0:
            stream = pb_utils.InferenceRequest(
                model_name="ticker",
                inputs=[pb_utils.Tensor("N", np.array([1], np.int32))],
                requested_output_names=["VALUE"],
            ).exec(decoupled=True)
            first = next(iter(stream))
            os.write(write, bytes([int(pb_utils.get_output_tensor_by_name(first, "VALUE").as_numpy()[0])]))
            os._exit(0)
        os.close(write)
        first = os.read(read, 1)[0]
        os.close(read)
        os.waitpid(child, 0)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([first], np.int64))]) for _ in requests]
"""


def _config(inputs: str, outputs: str, decoupled: bool = False) -> str:
    policy = "model_transaction_policy { decoupled: true }\n" if decoupled else ""
    return f'backend: "python"\nmax_batch_size: 0\ninput [ {inputs} ]\noutput [ {outputs} ]\n{policy}'


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("bls-forked")
    models = {
        "doubler": (DOUBLER, _config(_tensor("IN", "INT64", -1), _tensor("OUT", "INT64", -1))),
        "counter": (COUNTER, _config(_tensor("N", "INT32", 1), _tensor("VALUE", "INT32", 1), decoupled=True)),
        "ticker": (TICKER, _config(_tensor("N", "INT32", 1), _tensor("VALUE", "INT32", 1), decoupled=True)),
        "leaver": (LEAVER, _config(_tensor("SIZE", "INT32", 1), _tensor("OUT", "INT64", 1))),
        "forker": (
            FORKER,
            _config(
                _tensor("SIZE", "INT32", 1), f"{_tensor('OUT', 'INT64', -1)}, {_tensor('GRAND', 'INT64', 1)}"
            ),
        ),
    }
    for name, (source, config) in models.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(source)
        (root / name / "config.pbtxt").write_text(config)
    process = ServerProcess([root]).start(timeout=120)
    yield process
    process.close()


def _tensor(name: str, datatype: str, dims: int) -> str:
    return f'{{ name: "{name}" data_type: TYPE_{datatype} dims: [ {dims} ] }}'


def test_bls_calls_from_forked_processes_are_answered(server: ServerProcess) -> None:
    with httpclient.InferenceServerClient(server.http_url, network_timeout=120) as client:
        for _ in range(2):  # a second execute forks a new pool: the stub serves on
            size = httpclient.InferInput("SIZE", [1], "INT32")
            size.set_data_from_numpy(np.array([5], np.int32))
            result = client.infer("forker", [size])
            assert result.as_numpy("OUT").tolist() == [2 * 40000 * seed + 3 for seed in range(1, 6)]
            assert result.as_numpy("GRAND").tolist() == [42]
        # The stub's own calls are untouched by its children's.
        value = httpclient.InferInput("IN", [2], "INT64")
        value.set_data_from_numpy(np.array([4, 5], np.int64))
        assert client.infer("doubler", [value]).as_numpy("OUT").tolist() == [8, 10]
    assert "Traceback" not in server.log


def test_the_calls_of_a_child_that_exits_are_cancelled(server: ServerProcess) -> None:
    """Nobody reads them any more: the stub cancels them for the child (the stream ran on)."""
    with httpclient.InferenceServerClient(server.http_url, network_timeout=120) as client:
        size = httpclient.InferInput("SIZE", [1], "INT32")
        size.set_data_from_numpy(np.array([1], np.int32))
        assert client.infer("leaver", [size]).as_numpy("OUT").tolist() == [0]
    wait_until(lambda: "ticker cancelled after" in server.log, "the ticker's request cancelled", timeout=30)


# A process forked in initialize that would sleep for an hour; OUT: its pid.
SLEEPER = """
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.child = os.fork()
        if self.child == 0:
            time.sleep(3600)
            os._exit(0)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([self.child], np.int64))]) for _ in requests]
"""


def _running(pid: int) -> bool:
    """Whether a process runs (a zombie, ended and not yet reaped by init, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.parametrize("stop", ["unload", "kill"])
def test_a_process_the_model_forked_and_left_ends_with_its_stub(tmp_path: Path, stop: str) -> None:
    """It ends with its stub, whether the stub finishes (an unload: SIGTERM to the stub's
    process group) or is killed (a finalize() past the exit timeout: the server's SIGKILL takes
    the stub's group). It used to outlive the server."""
    source = SLEEPER + ("    def finalize(self):\n        time.sleep(60)\n" if stop == "kill" else "")
    (tmp_path / "sleeper" / "1").mkdir(parents=True)
    (tmp_path / "sleeper" / "1" / "model.py").write_text(source)
    (tmp_path / "sleeper" / "config.pbtxt").write_text(
        _config(_tensor("SIZE", "INT32", 1), _tensor("OUT", "INT64", 1))
    )
    flags = ["--model-control-mode=explicit", "--load-model=sleeper", "--exit-timeout-secs=2"]
    process = ServerProcess([tmp_path], flags).start()
    try:
        with httpclient.InferenceServerClient(process.http_url, network_timeout=60) as client:
            size = httpclient.InferInput("SIZE", [1], "INT32")
            size.set_data_from_numpy(np.array([1], np.int32))
            child = int(client.infer("sleeper", [size]).as_numpy("OUT")[0])
            assert _running(child)
            if stop == "unload":
                client.unload_model("sleeper")
                wait_until(lambda: not _running(child), "the forked process ended", timeout=30)
    finally:
        process.close()
    wait_until(lambda: not _running(child), "the forked process ended", timeout=30)
