"""The worker processes that parse large JSON bodies (server/rest/_json_workers.py, json_worker.py).

Real worker processes on the test's event loop: what they parse is what the server parses on
its loop, errors included; a worker that dies, or whose client leaves, is replaced; the queue
and the memory of the workers are bounded.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable

import numpy as np
import orjson
import pytest

from coreserve.config import parse_config
from coreserve.config.signature import ModelSignature
from coreserve.errors import CoreserveError, InternalError, UnavailableError
from coreserve.protocol.generate import decode_generate_request
from coreserve.protocol.http_body import complete_infer_request, decode_infer_request, split_infer_body
from coreserve.server.rest._json_workers import JsonWorkers
from coreserve.types import InferenceRequest

# Over a megabyte of JSON: a body the server parses in a worker.
LARGE = np.round(np.random.default_rng(5).random(200_000), 6).tolist()


def _body(data: object, shape: object = None, datatype: str = "FP32", name: str = "x") -> bytes:
    count = len(data) if isinstance(data, list) else 1
    tensor = {"name": name, "datatype": datatype, "shape": [count] if shape is None else shape, "data": data}
    return orjson.dumps({"id": "r1", "inputs": [tensor]})


BODIES = {
    "valid": _body(LARGE),
    "nested": _body([[value] for value in LARGE[:1000]], shape=[1000, 1]),
    "malformed": _body(LARGE)[:-3],
    "not an object": orjson.dumps(LARGE),
    "a shape of more elements than the data": _body(LARGE, shape=[len(LARGE) + 1]),
    "strings in FP32 data": _body(["1.5"] * 1000),
    "an unknown datatype": _body(LARGE, datatype="FP31"),
    "a value out of INT8's range": _body([1, 2, 300], datatype="INT8"),
    "ragged data": _body([[1.0, 2.0], [3.0]], shape=[2, 2]),
    "a repeated input": orjson.dumps({"id": "r2", "inputs": [orjson.loads(_body([1.0]))["inputs"][0]] * 2}),
}


def _outcome(decode: Callable[[], object]) -> tuple[str, object]:
    try:
        request, _ = decode()  # type: ignore[misc]
    except CoreserveError as exc:
        return type(exc).__name__, exc.message
    return "request", {
        name: (array.dtype.str, array.shape, array.tolist()) for name, array in request.inputs.items()
    }


def _run(scenario: Callable[[JsonWorkers], Awaitable[None]], **options: int) -> None:
    async def main() -> None:
        workers = JsonWorkers(**options)
        try:
            await scenario(workers)
        finally:
            workers.close()

    asyncio.run(asyncio.wait_for(main(), 120))


async def _parse(workers: JsonWorkers, body: bytes) -> tuple[str, object]:
    header, binary = split_infer_body(body, None)
    try:
        document = await workers.parse_infer(header, len(binary), "m")
    except CoreserveError as exc:
        return type(exc).__name__, exc.message
    return _outcome(lambda: complete_infer_request(document, binary, "m", ""))


async def _exits(pid: int) -> bool:
    """True once process `pid` is gone (reaped by the workers' waiting thread)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        await asyncio.sleep(0.02)
    return False


def test_a_worker_parses_each_body_as_the_loop_does() -> None:
    async def scenario(workers: JsonWorkers) -> None:
        for name, body in BODIES.items():
            expected = _outcome(lambda body=body: decode_infer_request(body, None, "m", ""))  # type: ignore[misc]
            assert await _parse(workers, body) == expected, name
        assert len(workers.pids) == 1  # one worker, started once, parsed them all

    _run(scenario, processes=1)


def _generate_outcome(request: InferenceRequest) -> tuple[object, ...]:
    return request.id, request.parameters, {name: array.tolist() for name, array in request.inputs.items()}


def test_a_worker_parses_generate_bodies_as_the_loop_does() -> None:
    config = parse_config(
        'name: "g" backend: "python" max_batch_size: 0 '
        'input [{ name: "IN" data_type: TYPE_FP32 dims: [ -1 ] }] '
        'output [{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }]'
    )
    signature = ModelSignature(config)

    async def scenario(workers: JsonWorkers) -> None:
        valid = orjson.dumps({"IN": LARGE, "temperature": 0.5, "id": "q"})
        parsed = await workers.parse_generate(valid, signature.inputs, signature.batching)
        expected = decode_generate_request(valid, signature, "g", "1")
        assert _generate_outcome(parsed.request("g", "1")) == _generate_outcome(expected)
        for bad in (orjson.dumps({"IN": ["a"] * 1000}), orjson.dumps({"IN": LARGE, "x": [1]}), b"{"):
            with pytest.raises(CoreserveError) as expected_error:
                decode_generate_request(bad, signature, "g", "1")
            with pytest.raises(CoreserveError) as error:
                await workers.parse_generate(bad, signature.inputs, signature.batching)
            assert (type(error.value), error.value.message) == (
                type(expected_error.value),
                expected_error.value.message,
            )

    _run(scenario, processes=1)


def test_a_worker_that_dies_fails_its_request_clearly_and_the_next_gets_a_new_one() -> None:
    async def scenario(workers: JsonWorkers) -> None:
        assert (await _parse(workers, BODIES["nested"]))[0] == "request"
        (pid,) = workers.pids
        parsing = asyncio.ensure_future(_parse(workers, BODIES["valid"]))
        await asyncio.sleep(0)  # its body is on its way to the worker
        os.kill(pid, 9)
        kind, message = await parsing
        assert kind == InternalError.__name__
        assert "exited" in str(message) and "before it answered" in str(message), message
        assert await _parse(workers, BODIES["valid"]) == _outcome(
            lambda: decode_infer_request(BODIES["valid"], None, "m", "")
        )
        assert workers.pids and pid not in workers.pids

    _run(scenario, processes=1)


def test_a_body_whose_client_left_stops_its_worker() -> None:
    async def scenario(workers: JsonWorkers) -> None:
        assert (await _parse(workers, BODIES["nested"]))[0] == "request"
        (pid,) = workers.pids
        parsing = asyncio.ensure_future(_parse(workers, BODIES["valid"]))
        await asyncio.sleep(0)
        parsing.cancel()  # what the frontend does when the client disconnects
        with pytest.raises(asyncio.CancelledError):
            await parsing
        assert await _exits(pid)
        assert workers.pids == []
        assert (await _parse(workers, BODIES["nested"]))[0] == "request"

    _run(scenario, processes=1)


def test_bodies_past_the_waiting_bound_are_refused_and_the_others_parsed() -> None:
    async def scenario(workers: JsonWorkers) -> None:
        first = asyncio.ensure_future(_parse(workers, BODIES["valid"]))
        second = asyncio.ensure_future(_parse(workers, BODIES["valid"]))
        await asyncio.sleep(0)  # the first has the worker, the second waits for it
        header, binary = split_infer_body(BODIES["valid"], None)
        with pytest.raises(UnavailableError, match="waiting to be parsed"):
            await workers.parse_infer(header, len(binary), "m")
        assert [(await first)[0], (await second)[0]] == ["request", "request"]

    _run(scenario, processes=1, max_waiting=1)


def test_a_worker_over_its_memory_bound_is_replaced_after_its_job() -> None:
    async def scenario(workers: JsonWorkers) -> None:
        assert (await _parse(workers, BODIES["nested"]))[0] == "request"
        assert workers.pids == []  # every worker is over a bound of one byte
        assert (await _parse(workers, BODIES["nested"]))[0] == "request"

    _run(scenario, processes=1, recycle_rss_bytes=1)


def test_closing_ends_the_workers() -> None:
    async def scenario(workers: JsonWorkers) -> None:
        await asyncio.gather(*(_parse(workers, body) for body in (BODIES["valid"], BODIES["nested"])))
        pids = workers.pids
        assert len(pids) == 2
        workers.close()
        assert all([await _exits(pid) for pid in pids])
        with pytest.raises(UnavailableError, match="stopping"):
            await _parse_raising(workers, BODIES["nested"])

    _run(scenario, processes=2)


async def _parse_raising(workers: JsonWorkers, body: bytes) -> object:
    header, binary = split_infer_body(body, None)
    return await workers.parse_infer(header, len(binary), "m")
