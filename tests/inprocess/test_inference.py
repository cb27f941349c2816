"""Inference through coreserve.Server in-process: numpy in and out, DLPack, text, async, streams."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch

import coreserve
from support.model_builders import accumulator_model, write_model
from support.waiting import wait_until


def _pair(batch: int = 2) -> dict[str, np.ndarray]:
    first = np.arange(batch * 4, dtype=np.float32).reshape(batch, 4)
    return {"INPUT0": first, "INPUT1": np.full((batch, 4), 2.0, np.float32)}


def test_infer_answers_numpy_arrays_with_the_request_id(server: coreserve.Server) -> None:
    inputs = _pair()
    result = server.model("add_sub").infer(inputs, request_id="r-1")
    assert result.id == "r-1"
    assert (result.model_name, result.model_version) == ("add_sub", "1")
    np.testing.assert_array_equal(result.outputs["OUTPUT0"], inputs["INPUT0"] + 2)
    np.testing.assert_array_equal(result.outputs["OUTPUT1"], inputs["INPUT0"] - 2)
    assert result.outputs["OUTPUT0"].dtype == np.float32


def test_requested_outputs_are_the_only_ones_returned(server: coreserve.Server) -> None:
    result = server.model("add_sub", 1).infer(_pair(1), outputs=["OUTPUT1"])
    assert list(result.outputs) == ["OUTPUT1"]


def test_dlpack_tensors_and_lists_are_inputs_too(server: coreserve.Server) -> None:
    first = torch.arange(4, dtype=torch.float32).reshape(1, 4)
    result = server.model("add_sub").infer({"INPUT0": first, "INPUT1": np.ones((1, 4), np.float32)})
    np.testing.assert_array_equal(result.outputs["OUTPUT0"], [[1, 2, 3, 4]])
    # A list keeps numpy's dtype for it (FP64 here): refused by an FP32 model, never cast.
    with pytest.raises(coreserve.InvalidArgumentError, match=r"INPUT1.*FP64"):
        server.model("add_sub").infer({"INPUT0": first, "INPUT1": [[1.0, 1.0, 1.0, 1.0]]})
    listed = server.model("add_sub").infer({"INPUT0": first, "INPUT1": [[np.float32(1)] * 4]})
    np.testing.assert_array_equal(listed.outputs["OUTPUT1"], [[-1, 0, 1, 2]])


def test_text_inputs_become_bytes_tensors(server: coreserve.Server) -> None:
    numbers = [str(i) for i in range(16)]
    result = server.model("simple_string").infer({"INPUT0": [numbers], "INPUT1": np.array([["1"] * 16])})
    assert result.outputs["OUTPUT0"].dtype == np.object_
    assert [int(v) for v in result.outputs["OUTPUT0"][0]] == [i + 1 for i in range(16)]


def test_client_mistakes_raise_coreserve_errors(server: coreserve.Server) -> None:
    with pytest.raises(coreserve.NotFoundError, match="'nope'"):
        server.model("nope").infer(_pair())
    with pytest.raises(coreserve.InvalidArgumentError, match=r"INPUT0.*FP64.*FP32"):
        server.model("add_sub").infer(_pair() | {"INPUT0": np.zeros((2, 4))})
    with pytest.raises(coreserve.InvalidArgumentError, match="unexpected inference input 'X'"):
        server.model("add_sub").infer(_pair() | {"X": np.zeros((2, 4), np.float32)})
    with pytest.raises(coreserve.InvalidArgumentError, match=r"not a tensor|Python objects"):
        server.model("add_sub").infer({"INPUT0": [object()], "INPUT1": np.zeros((1, 4), np.float32)})
    with pytest.raises(coreserve.UnsupportedError, match=r"Model.stream"):
        server.model("countdown").infer({"N": np.array([2], np.int32)})
    # The server keeps serving after each of them.
    assert server.model("add_sub").infer(_pair()).outputs["OUTPUT0"].shape == (2, 4)


def test_a_decoupled_model_streams_every_response(server: coreserve.Server) -> None:
    responses = list(server.model("countdown").stream({"N": np.array([4], np.int32)}))
    assert [int(r.outputs["VALUE"][0]) for r in responses] == [4, 3, 2, 1]


def test_an_ordinary_model_streams_its_one_response(server: coreserve.Server) -> None:
    (response,) = server.model("add_sub").stream(_pair(1))
    np.testing.assert_array_equal(response.outputs["OUTPUT0"], [[2, 3, 4, 5]])


def test_leaving_a_stream_early_cancels_the_request(server: coreserve.Server) -> None:
    model = server.model("streamer")  # one instance, busy until a request ends
    before = _outcomes(model)
    for response in model.stream({"N": np.array([20_000], np.int32)}):
        assert int(response.outputs["VALUE"][0]) == 0
        break
    values = [int(r.outputs["VALUE"][0]) for r in model.stream({"N": np.array([2], np.int32)})]
    assert values == [0, 1]
    # The first request ended cancelled, before the second ran on the one instance (uncancelled,
    # it would have held the instance for 40 s or more and ended a success).
    # (The server counts an outcome just after it answers.)
    wait_until(lambda: _outcomes(model) == (before[0] + 1, before[1] + 1), "one cancelled, one success")


def _outcomes(model: coreserve.Model) -> tuple[int, int]:
    """How many of a model's requests ended a success and how many failed (cancelled included)."""
    inference = model.statistics()["model_stats"][0]["inference_stats"]
    return int(inference["success"]["count"]), int(inference["fail"]["count"])


def test_async_calls_run_on_the_callers_loop(server: coreserve.Server) -> None:
    async def main() -> tuple[list[coreserve.InferenceResponse], list[int]]:
        model = server.model("add_sub")
        results = await asyncio.gather(*(model.async_infer(_pair(1), request_id=str(i)) for i in range(8)))
        values = [
            int(r.outputs["VALUE"][0])
            async for r in server.model("countdown").async_stream({"N": np.array([3], np.int32)})
        ]
        return list(results), values

    results, values = asyncio.run(main())
    assert [r.id for r in results] == [str(i) for i in range(8)]
    assert values == [3, 2, 1]


def test_async_errors_are_coreserve_errors(server: coreserve.Server) -> None:
    async def main() -> None:
        with pytest.raises(coreserve.NotFoundError):
            await server.model("nope").async_infer(_pair())
        with pytest.raises(coreserve.NotFoundError):
            async for _ in server.model("nope").async_stream(_pair()):
                pass

    asyncio.run(main())


def test_the_blocking_api_works_inside_a_running_loop(server: coreserve.Server) -> None:
    async def main() -> coreserve.InferenceResponse:
        return server.model("add_sub").infer(_pair(1))

    assert asyncio.run(main()).outputs["OUTPUT0"].shape == (1, 4)


def test_cancelled_async_calls_cancel_their_requests(server: coreserve.Server) -> None:
    sleepy, streamer = server.model("sleepy"), server.model("streamer")
    executions = sleepy.statistics()["model_stats"][0]["execution_count"]
    slept, streamed = _outcomes(sleepy), _outcomes(streamer)

    async def main() -> None:
        calls = [asyncio.ensure_future(sleepy.async_infer({"X": np.array([i], np.int32)})) for i in range(10)]
        seen = []

        async def consume() -> None:
            async for response in streamer.async_stream({"N": np.array([20_000], np.int32)}):
                seen.append(response)

        streaming = asyncio.ensure_future(consume())
        while not seen or server.pending_requests() < 11:  # every call is in, the stream runs
            await asyncio.sleep(0.01)
        for task in [*calls, streaming]:
            task.cancel()
        results = await asyncio.gather(*calls, streaming, return_exceptions=True)
        assert all(isinstance(result, asyncio.CancelledError) for result in results)

    asyncio.run(main())
    # Both models answer again: their single instances were freed by the cancellations
    # (uncancelled, 10 x 0.5 s of sleepy and 40 s of streamer would run first, and end
    # successes). The stream ended cancelled; the ten sleepy calls too, and at most the one
    # running when they were cancelled (and any taken meanwhile) executed.
    assert sleepy.infer({"X": np.array([1], np.int32)}).outputs["Y"].tolist() == [1]
    assert len(list(streamer.stream({"N": np.array([3], np.int32)}))) == 3
    wait_until(lambda: _outcomes(streamer) == (streamed[0] + 1, streamed[1] + 1), "the stream cancelled")
    wait_until(lambda: _outcomes(sleepy)[0] == slept[0] + 1, "one sleepy success")
    assert sleepy.statistics()["model_stats"][0]["execution_count"] - executions <= 1 + 4


ACCUMULATOR = """
backend: "onnxruntime"
max_batch_size: 2
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
  state [ { input_name: "acc_in" output_name: "acc_out" data_type: TYPE_INT32 dims: [ 1 ] } ]
}
"""


def test_request_parameters_drive_sequences(tmp_path: Path) -> None:
    write_model(tmp_path, "accumulator", accumulator_model(), ACCUMULATOR)
    with coreserve.Server(tmp_path) as server:
        model = server.model("accumulator")

        def add(sequence: int, value: int, *, start: bool = False, end: bool = False) -> int:
            parameters = {"sequence_id": sequence, "sequence_start": start, "sequence_end": end}
            result = model.infer({"INPUT": np.array([[value]], np.int32)}, parameters=parameters)
            return int(result.outputs["OUTPUT"][0, 0])

        assert add(7, 1, start=True) == 1
        assert add(9, 100, start=True) == 100
        assert add(7, 2) == 3
        assert add(9, 5) == 105
        assert add(7, 3, end=True) == 6
        with pytest.raises(coreserve.InvalidArgumentError, match="sequence"):
            add(7, 1)  # ended: a new request needs sequence_start
