"""A model that is not decoupled may answer through its request's response sender, as Triton
2.51 allows (its L0 `response_sender` tests): one response with the final flag, or one then the
flag, before or after execute() returns None in its place. Checked side by side with the real
Triton: every answer here is Triton's gRPC stream's (where a second response is refused,
Triton's HTTP body is unreadable), and a BLS call of such a model crashes Triton."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerProcess

SIGNATURE = """
input [ { name: "MODE" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
"""
# Each request's MODE says how the model answers it; OUT tells which answer arrived: 0 the
# returned response, 1000s one sent before execute returned, 2000 one sent after.
MODEL = """
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def out(value, shape):
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.full(shape, value, np.int32))])


def after_return(send):
    def run():
        time.sleep(0.2)
        try:
            send()
        except pb_utils.TritonModelException as exc:
            pb_utils.Logger.log_info(f"after return: {exc}")

    threading.Thread(target=run, daemon=True).start()


class TritonPythonModel:
    def answer(self, request):
        mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()
        shape, mode = mode.shape, mode.reshape(-1)[0].decode()
        if mode == "on_return":
            return out(0, shape)
        sender = request.get_response_sender()
        if mode == "before":
            sender.send(out(1000, shape))
            sender.send(flags=FINAL)
        elif mode == "before_final":
            sender.send(out(1001, shape), FINAL)
        elif mode == "after":
            after_return(lambda: (sender.send(out(2000, shape)), sender.send(flags=FINAL)))
        elif mode == "same_sender":  # (one sender per request, at every call)
            request.get_response_sender().send(out(1003, shape))
            request.get_response_sender().send(flags=FINAL)
        elif mode == "before_and_return":  # the returned one is refused: the request has its answer
            sender.send(out(1000, shape), FINAL)
            return out(0, shape)
        elif mode == "return_then_after":  # the one sent after is refused
            after_return(lambda: sender.send(out(2000, shape), FINAL))
            return out(0, shape)
        elif mode == "final_first":
            sender.send(flags=FINAL)
        elif mode == "two":
            sender.send(out(1000, shape))
            sender.send(out(1002, shape))
        elif mode == "one_then_return":
            sender.send(out(1000, shape))
            return out(0, shape)
        elif mode == "large_from_a_thread":  # sent (and counted) as execute returns; written after
            large = out(3000, (20_000_000,))
            threading.Thread(target=sender.send, args=(large, FINAL), daemon=True).start()
            time.sleep(0.001)
        return None

    def execute(self, requests):
        if pb_utils.get_input_tensor_by_name(requests[0], "MODE").as_numpy().reshape(-1)[0] == b"none":
            return None
        return [self.answer(request) for request in requests]
"""
ASYNC_MODEL = """
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.tasks = set()

    async def execute(self, requests):
        for request in requests:
            task = asyncio.create_task(self.answer_later(request.get_response_sender()))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        return None

    async def answer_later(self, sender):
        await asyncio.sleep(0.2)
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([2000], np.int32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""
# Decoupled: two responses from a thread, after execute returned.
DECOUPLED_LATER = """
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.answer, args=(request.get_response_sender(),), daemon=True).start()
        return None

    def answer(self, sender):
        time.sleep(0.2)
        for value in (1, 2):
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([[value]], np.int32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""
CALLER = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            answer = pb_utils.InferenceRequest(
                model_name="ordinary",
                inputs=[pb_utils.get_input_tensor_by_name(request, "MODE")],
                requested_output_names=["OUT"],
            ).exec()
            error = answer.error()
            responses.append(pb_utils.InferenceResponse(answer.output_tensors(), error=error))
        return responses
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("ordinary-sender")
    for name, source, extra in (
        ("ordinary", MODEL, "max_batch_size: 0\n"),
        # Three requests wait for each other: one execution answers them three ways.
        (
            "batching",
            MODEL,
            "max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 2000000 }\n",
        ),
        ("ordered", MODEL, "max_batch_size: 8\ndynamic_batching { preserve_ordering: true }\n"),
        (
            "decoupled_ordered",
            DECOUPLED_LATER,
            "max_batch_size: 8\ndynamic_batching { preserve_ordering: true }\n"
            "model_transaction_policy { decoupled: true }\n",
        ),
        ("async_model", ASYNC_MODEL, "max_batch_size: 0\n"),
        ("caller", CALLER, "max_batch_size: 0\n"),
    ):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(f'backend: "python"\n{extra}{SIGNATURE}')
        (root / name / "1" / "model.py").write_text(source)
    process = ServerProcess([root]).start(timeout=120)
    yield process
    process.close()


def _mode(client_module: object, mode: str, batched: bool = False) -> list[object]:
    tensor = client_module.InferInput("MODE", [1, 1] if batched else [1], "BYTES")  # type: ignore[attr-defined]
    tensor.set_data_from_numpy(np.array([[mode.encode()]] if batched else [mode.encode()], np.object_))
    return [tensor]


def _http(server: ServerProcess, mode: str, model: str = "ordinary") -> int | str:
    """OUT, or the error's message."""
    with httpclient.InferenceServerClient(server.http_url, network_timeout=30) as client:
        try:
            return int(client.infer(model, _mode(httpclient, mode)).as_numpy("OUT")[0])
        except InferenceServerException as error:
            assert error.status() == "500"
            return error.message()


def _stream(server: ServerProcess, mode: str) -> list[int | str]:
    """What a gRPC stream gets for one request: OUT or the error's message, per response."""
    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        client.async_stream_infer("ordinary", _mode(grpcclient, mode))
        answers: list[int | str] = []
        result, error = got.get(timeout=30)
        answers.append(int(result.as_numpy("OUT")[0]) if error is None else error.message())
    finally:
        client.stop_stream()  # (waits for the stream to end: nothing may follow the answer)
        client.close()
    while not got.empty():
        result, error = got.get()
        answers.append(int(result.as_numpy("OUT")[0]) if error is None else error.message())
    return answers


@pytest.mark.parametrize(
    ("mode", "answer"),
    [
        ("on_return", 0),
        ("before", 1000),
        ("before_final", 1001),
        ("after", 2000),
        ("same_sender", 1003),
        ("before_and_return", 1000),
        ("return_then_after", 0),
    ],
)
def test_the_requests_one_response_comes_from_its_sender_or_its_return(
    server: ServerProcess, mode: str, answer: int
) -> None:
    """Before: a response without the final flag was a partial response, one after the return
    came too late (`returned without answering the request`)."""
    assert _http(server, mode) == answer
    assert _stream(server, mode) == [answer]


def test_a_response_written_after_execute_returned_is_the_answer(server: ServerProcess) -> None:
    """The sender took it before execute returned, its message came after execute's end (the
    request failed, and the late message made the server restart the stub)."""
    assert _http(server, "large_from_a_thread") == 3000
    assert "cannot handle" not in server.log


def test_a_response_sent_after_execute_returned_keeps_the_batch_order(server: ServerProcess) -> None:
    """Under `preserve_ordering` (the response was held for good, and the client waited)."""
    assert _batched(server, "after", model="ordered") == 2000


def test_a_decoupled_models_responses_after_execute_returned_keep_the_batch_order(
    server: ServerProcess,
) -> None:
    """Under `preserve_ordering` they were held for good (the stream never ended)."""
    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        client.async_stream_infer("decoupled_ordered", _mode(grpcclient, "any", batched=True))
        values = []
        for _ in range(2):
            result, error = got.get(timeout=30)
            assert error is None
            values.append(int(result.as_numpy("OUT")[0, 0]))
    finally:
        client.stop_stream()
        client.close()
    assert values == [1, 2]


def test_an_async_execute_answers_after_it_returned(server: ServerProcess) -> None:
    assert _http(server, "after", model="async_model") == 2000


def test_a_bls_call_gets_the_answer_of_the_callees_sender(server: ServerProcess) -> None:
    assert _http(server, "before", model="caller") == 1000
    assert _http(server, "after", model="caller") == 2000  # (Triton 2.51 crashes here)


def test_a_final_flag_before_any_response_fails_the_request_in_tritons_words(server: ServerProcess) -> None:
    expected = (
        "Failed to process the request(s) for model 'ordinary_0', message: TritonModelException: Unable to "
        "send response. Non-decoupled model cannot send complete final before sending a response.\n\nAt:\n"
    )
    for answers in ([_http(server, "final_first")], _stream(server, "final_first")):
        assert len(answers) == 1
        assert isinstance(answers[0], str)
        assert answers[0].startswith(expected)


@pytest.mark.parametrize(
    ("mode", "logged"),
    [
        ("two", "TritonModelException: Unable to send response. Non-decoupled model cannot send more"),
        ("one_then_return", "message: Unable to send response. Non-decoupled model cannot send more"),
    ],
)
def test_a_second_response_is_refused_and_the_first_is_the_answer(
    server: ServerProcess, mode: str, logged: str
) -> None:
    """As a Triton gRPC stream answers (its L0 test): the refusal fails the execution, which
    the log tells, and the response sent first is the request's answer (here it was the
    error; Triton's HTTP body is both, unreadable)."""
    assert _http(server, mode) == 1000
    assert _stream(server, mode) == [1000]
    assert logged in server.log


def test_a_response_the_sender_refuses_after_the_return_is_the_models_error_alone(
    server: ServerProcess,
) -> None:
    """The request had its answer; the model's thread is told, as on Triton."""
    assert _http(server, "return_then_after") == 0
    told = "after return: Unable to send response. Non-decoupled model cannot send more than one response."
    deadline = time.monotonic() + 30
    while told not in server.log and time.monotonic() < deadline:
        time.sleep(0.05)
    assert told in server.log


def test_a_none_return_fails_the_requests_no_sender_answers(server: ServerProcess) -> None:
    """Triton takes None and leaves the client waiting; here it is told why."""
    assert _http(server, "none") == "the model ended the request without a response; it expects one response"


def test_one_execution_answers_its_requests_each_its_way_and_counts_each_once(server: ServerProcess) -> None:
    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(_batched, server, mode) for mode in ("on_return", "before", "after")]
        assert [future.result() for future in futures] == [0, 1000, 2000]
    with httpclient.InferenceServerClient(server.http_url) as client:
        stats = client.get_inference_statistics("batching")["model_stats"][0]
    assert stats["execution_count"] == 1
    assert stats["inference_count"] == 3
    assert stats["inference_stats"]["success"]["count"] == 3
    assert stats["inference_stats"]["fail"]["count"] == 0
    assert stats["batch_stats"][0]["batch_size"] == 3


def _batched(server: ServerProcess, mode: str, model: str = "batching") -> int:
    with httpclient.InferenceServerClient(server.http_url, network_timeout=30) as client:
        return int(client.infer(model, _mode(httpclient, mode, batched=True)).as_numpy("OUT")[0, 0])


def test_a_request_answered_after_the_return_counts_once_as_a_success(server: ServerProcess) -> None:
    with httpclient.InferenceServerClient(server.http_url) as client:
        before = client.get_inference_statistics("async_model")["model_stats"][0]["inference_stats"]
        assert _http(server, "after", model="async_model") == 2000
        after = client.get_inference_statistics("async_model")["model_stats"][0]["inference_stats"]
    assert after["success"]["count"] == before["success"]["count"] + 1
    assert after["fail"]["count"] == before["fail"]["count"]


def test_the_server_serves_on(server: ServerProcess) -> None:
    assert _http(server, "on_return") == 0
    assert "Traceback" not in server.log
