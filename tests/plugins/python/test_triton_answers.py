"""What a Python model's mistakes and corner cases answer, as Triton 2.51 answers them (each
checked side by side with the real server): decoupled senders after an error, a decoupled
execute that returns responses, outputs the configuration does not list or the model did not
produce, return values Triton refuses, error codes, and a BLS stream over a model that is not
decoupled."""

from __future__ import annotations

import json
import queue
import urllib.error
import urllib.request
from collections.abc import Iterator
from functools import partial

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerProcess

SIGNATURE = """
input [ { name: "MODE" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "OTHER" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
# Each request's MODE says what the model does.
DECOUPLED = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def out(value):
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([value], np.int32))])


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0].decode()
            sender = request.get_response_sender()
            if mode == "error_then_more":  # an error without the final flag, then more
                sender.send(out(1))
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("midway")))
                sender.send(out(3))
                sender.send(flags=FINAL)
            elif mode == "error_then_final":
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("first")))
                sender.send(flags=FINAL)
            elif mode == "final_with_last":  # the final flag comes with the last response
                sender.send(out(1))
                sender.send(out(2), flags=FINAL)
            elif mode == "slow_first":
                time.sleep(2)
                sender.send(out(5), flags=FINAL)
            elif mode == "returns":  # a decoupled model must return None
                return [out(9)]
        return None
"""
ORDINARY = """
import numpy as np
import triton_python_backend_utils as pb_utils


def tensor(name, value):
    return pb_utils.Tensor(name, np.array([value], np.int32))


class TritonPythonModel:
    def execute(self, requests):
        mode = pb_utils.get_input_tensor_by_name(requests[0], "MODE").as_numpy()[0].decode()
        if mode == "unlisted":
            return [pb_utils.InferenceResponse([tensor("NOPE", 1), tensor("OTHER", 2)])]
        if mode == "tuple":
            return (pb_utils.InferenceResponse([tensor("OUT", 1)]),)
        if mode == "none_for_two":
            return []
        if mode == "none_in_list":  # (Triton leaves its client waiting)
            return [None]
        if mode == "unknown_code":
            return [pb_utils.InferenceResponse(error=pb_utils.TritonError("odd", pb_utils.TritonError.UNKNOWN))]
        if mode == "raise":
            self.fail()
        if mode == "bls_unknown":  # the callee's code comes back (Triton's is always INTERNAL)
            call = pb_utils.InferenceRequest(
                model_name="target",
                inputs=[pb_utils.Tensor("MODE", np.array([b"unknown_code"], np.object_))],
                requested_output_names=["OUT"],
            ).exec()
            return [pb_utils.InferenceResponse([tensor("OUT", int(call.error().code()))])]
        if mode == "bls_stream":  # a decoupled BLS call of a model that is not decoupled
            call = pb_utils.InferenceRequest(
                model_name="target",
                inputs=[pb_utils.Tensor("MODE", np.array([b"plain"], np.object_))],
                requested_output_names=["OUT"],
            )
            count = len(list(call.exec(decoupled=True)))
            return [pb_utils.InferenceResponse([tensor("OUT", count)])]
        if mode == "bls_stream_twice":  # how many responses each of two passes gives, as digits
            call = pb_utils.InferenceRequest(
                model_name="decoupled",
                inputs=[pb_utils.Tensor("MODE", np.array([b"error_then_more"], np.object_))],
                requested_output_names=["OUT"],
            )
            responses = call.exec(decoupled=True)
            first = sum(1 for _ in responses)
            return [pb_utils.InferenceResponse([tensor("OUT", 10 * first + sum(1 for _ in responses))])]
        if mode in ("bls_error_stream", "bls_final_stream"):
            # The responses of a decoupled call as digits: OUT's value, 9 for an error, 0 for none.
            callee = b"error_then_more" if mode == "bls_error_stream" else b"final_with_last"
            call = pb_utils.InferenceRequest(
                model_name="decoupled",
                inputs=[pb_utils.Tensor("MODE", np.array([callee], np.object_))],
                requested_output_names=["OUT"],
            )
            digits = ""
            for response in call.exec(decoupled=True):
                out = pb_utils.get_output_tensor_by_name(response, "OUT")
                digits += "9" if response.has_error() else str(out.as_numpy()[0]) if out is not None else "0"
            return [pb_utils.InferenceResponse([tensor("OUT", int(digits))])]
        return [pb_utils.InferenceResponse([tensor("OUT", 7), tensor("OTHER", 8)])]

    def fail(self):
        raise ValueError("on purpose")
"""

# Two coroutines at once: a decoupled BLS call whose first response takes 2 s, and a sleep of
# 0.1 s. OUT: the order in which they went on (21: the sleep first, the call's await waited).
ASYNC_CALLER = """
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        order = []

        async def call():
            stream = await pb_utils.InferenceRequest(
                model_name="decoupled",
                inputs=[pb_utils.Tensor("MODE", np.array([b"slow_first"], np.object_))],
                requested_output_names=["OUT"],
            ).async_exec(decoupled=True)
            order.append(1)
            assert [pb_utils.get_output_tensor_by_name(r, "OUT").as_numpy()[0] for r in stream] == [5]

        async def sleep():
            await asyncio.sleep(0.1)
            order.append(2)

        await asyncio.gather(call(), sleep())
        out = np.array([10 * order[0] + order[1]], np.int32)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]) for _ in requests]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("triton-answers")
    for name, source, extra in (
        ("decoupled", DECOUPLED, "model_transaction_policy { decoupled: true }\n"),
        ("ordinary", ORDINARY, ""),
        ("target", ORDINARY, ""),  # (a BLS call of its own model would wait for its one instance)
        ("async_caller", ASYNC_CALLER, ""),
    ):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(f'backend: "python"\nmax_batch_size: 0\n{SIGNATURE}{extra}')
        (root / name / "1" / "model.py").write_text(source)
    process = ServerProcess([root]).start(timeout=120)
    yield process
    process.close()


def _mode(client_module: object, mode: str) -> list[object]:
    tensor = client_module.InferInput("MODE", [1], "BYTES")  # type: ignore[attr-defined]
    tensor.set_data_from_numpy(np.array([mode.encode()], np.object_))
    return [tensor]


def _stream(server: ServerProcess, mode: str) -> list[tuple[str, list[int] | None, bool]]:
    """What a gRPC stream gets for one request that asks for empty finals: (error, OUT, final
    flag) per message (the raw stub: tritonclient hides an error's parameters)."""
    message = service_pb2.ModelInferRequest(model_name="decoupled", id="r")
    message.parameters["triton_enable_empty_final_response"].bool_param = True
    tensor = message.inputs.add(name="MODE", datatype="BYTES", shape=[1])
    tensor.contents.bytes_contents.append(mode.encode())
    got: list[tuple[str, list[int] | None, bool]] = []
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for reply in stub.ModelStreamInfer(iter([message]), timeout=30):  # (it ends with its request)
            response = reply.infer_response
            names = [output.name for output in response.outputs]
            out = (
                np.frombuffer(response.raw_output_contents[names.index("OUT")], np.int32).tolist()
                if "OUT" in names
                else None
            )
            got.append((reply.error_message, out, response.parameters["triton_final_response"].bool_param))
    return got


def test_an_error_without_the_final_flag_is_one_response_and_the_rest_follow(server: ServerProcess) -> None:
    """As on Triton (checked side by side), over a gRPC stream, generate_stream and a BLS
    stream; the request counts as a success. (Here it used to end the request; once, it killed
    the stub.)"""
    with httpclient.InferenceServerClient(server.http_url) as client:
        before = client.get_inference_statistics("decoupled")["model_stats"][0]["inference_stats"]
    assert _stream(server, "error_then_more") == [
        ("", [1], False),
        ("midway", None, False),
        ("", [3], False),
        ("", None, True),
    ]
    assert _stream(server, "error_then_final") == [("first", None, False), ("", None, True)]
    status, body = _post(server, "/v2/models/decoupled/generate_stream", {"MODE": "error_then_more"})
    assert status == 200
    assert [line for line in body.decode().splitlines() if line] == [
        'data: {"OUT":1,"model_name":"decoupled","model_version":"1"}',
        'data: {"error":"midway"}',
        'data: {"OUT":3,"model_name":"decoupled","model_version":"1"}',
    ]
    assert _post(server, "/v2/models/decoupled/generate", {"MODE": "error_then_final"}) == (
        500,  # (TritonError's code: INTERNAL)
        b'{"error":"first"}',
    )
    assert _http(server, "bls_error_stream", ["OUT"]) == {"OUT": [130]}  # (Triton's BLS leaves the error out)
    with httpclient.InferenceServerClient(server.http_url) as client:
        after = client.get_inference_statistics("decoupled")["model_stats"][0]["inference_stats"]
    assert after["fail"]["count"] == before["fail"]["count"]
    assert after["success"]["count"] == before["success"]["count"] + 5
    assert "cannot handle" not in server.log and "exited unexpectedly" not in server.log
    assert "Traceback" not in server.log


def _post(server: ServerProcess, path: str, document: dict[str, str]) -> tuple[int, bytes]:
    request = urllib.request.Request(f"http://{server.http_url}{path}", data=json.dumps(document).encode())
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read()


def test_triton_grpc_error_mode_ends_the_stream_at_the_first_error_with_its_status(
    server: ServerProcess,
) -> None:
    """Triton's `triton_grpc_error: true` stream header; without it the stream goes on."""
    for header, expected in (
        ("true", [7, "StatusCode.INTERNAL"]),
        ("false", [7, None, 7]),
    ):
        got: queue.Queue = queue.Queue()
        client = grpcclient.InferenceServerClient(server.grpc_url)
        client.start_stream(callback=partial(_put, got), headers={"triton_grpc_error": header})
        try:
            for mode in ("plain", "raise", "plain"):
                client.async_stream_infer(
                    "ordinary", _mode(grpcclient, mode), outputs=[grpcclient.InferRequestedOutput("OUT")]
                )
            seen: list[object] = []
            for _ in range(len(expected)):
                result, error = got.get(timeout=30)
                seen.append(int(result.as_numpy("OUT")[0]) if error is None else error.status())
                if error is not None and header == "true":
                    assert "Failed to process the request(s) for model 'ordinary_0'" in error.message()
        finally:
            client.stop_stream()
            client.close()
        assert seen == expected
        assert got.empty()


def _put(into: queue.Queue, result: object, error: object) -> None:
    into.put((result, error))


def test_a_decoupled_execute_that_returns_responses_fails_its_requests_in_tritons_words(
    server: ServerProcess,
) -> None:
    """Its requests waited for good."""
    [(message, _, _)] = _stream(server, "returns")
    assert message == (
        "Failed to process the request(s) for model 'decoupled_0', message: Python model "
        "'decoupled_0' is using the decoupled mode and the execute function must return None."
    )


def _http(
    server: ServerProcess, mode: str, outputs: list[str] | None = None, model: str = "ordinary"
) -> dict[str, list[int]]:
    with httpclient.InferenceServerClient(server.http_url, network_timeout=60) as client:
        requested = None if outputs is None else [httpclient.InferRequestedOutput(name) for name in outputs]
        result = client.infer(model, _mode(httpclient, mode), outputs=requested)
        return {
            output["name"]: result.as_numpy(output["name"]).tolist()
            for output in result.get_response()["outputs"]
        }


def test_outputs_are_those_of_the_configuration_and_one_not_produced_is_left_out(
    server: ServerProcess,
) -> None:
    assert _http(server, "unlisted") == {"OTHER": [2]}  # NOPE is not in the configuration
    assert _http(server, "unlisted", ["OUT", "OTHER"]) == {"OTHER": [2]}  # was a 500
    assert _http(server, "plain", ["OTHER"]) == {"OTHER": [8]}


@pytest.mark.parametrize(
    ("mode", "status", "message"),
    [
        (
            "tuple",
            "500",
            "Failed to process the request(s) for model 'ordinary_0', message: Expected a list in the "
            "execute return, found type '<class 'tuple'>'.",
        ),
        (
            "none_for_two",
            "500",
            "Failed to process the request(s) for model 'ordinary_0', message: Number of InferenceResponse "
            "objects do not match the number of InferenceRequest objects. InferenceRequest(s) size is:1, and "
            "InferenceResponse(s) size is:0\n",
        ),
        ("unknown_code", "400", "odd"),
    ],
)
def test_what_triton_refuses_is_refused_in_its_words(
    server: ServerProcess, mode: str, status: str, message: str
) -> None:
    with pytest.raises(InferenceServerException) as info:
        _http(server, mode)
    assert (info.value.status(), info.value.message()) == (status, message)


def test_an_exception_names_the_instance_and_the_models_frames(server: ServerProcess) -> None:
    with pytest.raises(InferenceServerException) as info:
        _http(server, "raise")
    message = info.value.message()
    assert message.startswith(
        "Failed to process the request(s) for model 'ordinary_0', message: ValueError: on purpose\n\nAt:\n"
    )
    frames = message.split("At:\n", 1)[1].splitlines()
    assert [frame.rsplit(": ", 1)[1] for frame in frames] == ["fail", "execute"]  # innermost first
    assert all("/ordinary/1/model.py(" in frame for frame in frames)  # the stub's own are left out
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        with pytest.raises(InferenceServerException) as unknown:
            client.infer("ordinary", _mode(grpcclient, "unknown_code"))
        assert unknown.value.status() == "StatusCode.UNKNOWN"


def test_a_decoupled_bls_call_of_a_model_that_is_not_decoupled_yields_its_one_response(
    server: ServerProcess,
) -> None:
    assert _http(server, "bls_stream", ["OUT"]) == {"OUT": [1]}  # there was an empty one after it


def test_a_decoupled_bls_stream_iterated_again_replays_its_responses(server: ServerProcess) -> None:
    """As Triton's iterator (its QA bls test_response_iterator); the second pass gave none."""
    assert _http(server, "bls_stream_twice", ["OUT"]) == {"OUT": [33]}  # 1, 3 and the empty final


def test_a_decoupled_bls_stream_ends_with_the_response_the_final_flag_came_with(
    server: ServerProcess,
) -> None:
    """As Triton's iterator (its QA async_execute bls tests): an empty response comes last only
    where the final flag came alone; there was one after every stream."""
    assert _http(server, "bls_final_stream", ["OUT"]) == {"OUT": [12]}


def test_awaiting_a_decoupled_async_exec_waits_for_the_first_response(server: ServerProcess) -> None:
    """As Triton's: the await returns once the first response came, so that a plain `for` over
    the responses does not hold the event loop (the await returned at once, and the loop
    waited in the `for`, so concurrent executions ran one after another)."""
    assert _http(server, "any", ["OUT"], model="async_caller") == {"OUT": [21]}


def test_a_none_in_the_returned_list_fails_its_request_saying_so(server: ServerProcess) -> None:
    with pytest.raises(InferenceServerException) as info:
        _http(server, "none_in_list", ["OUT"])
    assert info.value.message() == "the model ended the request without a response; it expects one response"


def test_a_bls_callee_error_of_unknown_kind_keeps_its_code(server: ServerProcess) -> None:
    assert _http(server, "bls_unknown", ["OUT"]) == {"OUT": [0]}  # TritonError.UNKNOWN


def test_the_server_serves_on(server: ServerProcess) -> None:
    assert _http(server, "plain") == {"OUT": [7], "OTHER": [8]}
    assert "cannot handle" not in server.log
