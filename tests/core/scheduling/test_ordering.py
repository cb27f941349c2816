"""Ordered release in-process: with preserve_ordering, responses leave in batch order.

Several instances run batches side by side and the test decides which finishes first (a held
request waits for the test); the shared log records the order in which responses reached
their clients.
"""

from __future__ import annotations

import asyncio

from coreserve.errors import UnavailableError
from coreserve.scheduling._dynamic import DynamicBatcher
from coreserve.scheduling._ordering import HeldSink, OrderedRelease
from coreserve.types import InferenceRequest, InferenceResponse
from support.scheduling_doubles import (
    RecordingInstance,
    RecordingSink,
    make_request,
    model_config,
    run_scenario,
    settle,
    signature_and_statistics,
)

Log = list[tuple[str, str]]


def _batcher(
    preserve: bool, holds: dict[str, asyncio.Event]
) -> tuple[DynamicBatcher, list[RecordingInstance]]:
    """A batcher of single requests (max_batch_size 1) over three instances."""
    config = model_config(
        'name: "m" max_batch_size: 1 '
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ] '
        'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ] '
        f"dynamic_batching {{ preserve_ordering: {str(preserve).lower()} }}"
    )
    signature, statistics = signature_and_statistics(config)
    instances = [RecordingInstance(f"instance{index}", holds) for index in range(3)]
    return DynamicBatcher(signature, statistics, instances, config.dynamic_batching), instances


async def _finish_out_of_order(preserve: bool) -> tuple[Log, Log, Log]:
    """Runs a, b, c on three instances; c finishes, then b, then a. Returns the log after each."""
    holds = {"a": asyncio.Event(), "b": asyncio.Event()}
    batcher, instances = _batcher(preserve, holds)
    log: Log = []
    batcher.start()
    for name in "abc":
        batcher.submit(make_request(name, log))
        await settle()
    # Each instance took one request, in submission order.
    assert sorted(batch for instance in instances for batch in instance.batches) == [["a"], ["b"], ["c"]]
    after_c = list(log)
    holds["b"].set()
    await settle()
    after_b = list(log)
    holds["a"].set()
    await settle()
    await batcher.close(timeout=30)
    return after_c, after_b, log


def test_with_preserve_ordering_a_later_batch_waits_for_every_earlier_one() -> None:
    after_c, after_b, log = asyncio.run(_finish_out_of_order(preserve=True))
    assert after_c == []  # c is done but a and b are not
    assert after_b == []  # b is done but a is not
    assert log == [("a", "final"), ("b", "final"), ("c", "final")]


def test_without_preserve_ordering_responses_leave_as_batches_finish() -> None:
    after_c, after_b, log = asyncio.run(_finish_out_of_order(preserve=False))
    assert after_c == [("c", "final")]
    assert after_b == [("c", "final"), ("b", "final")]
    assert log == [("c", "final"), ("b", "final"), ("a", "final")]


def _request(name: str, log: Log) -> InferenceRequest:
    request = InferenceRequest("m", {}, id=name)
    request.sink = RecordingSink(name, log)
    return request


def test_held_responses_and_errors_replay_in_the_order_they_were_sent() -> None:
    async def scenario() -> None:
        log: Log = []
        release = OrderedRelease()
        first, second = _request("first", log), _request("second", log)
        first_turn_done = asyncio.Event()

        async def run_first() -> None:
            async with release.turn([first]):
                await first_turn_done.wait()
                assert first.sink is not None
                first.sink.fail(UnavailableError("gone"))

        async def run_second() -> None:
            async with release.turn([second]):
                assert isinstance(second.sink, HeldSink)
                response = InferenceResponse("m", "1", {})
                second.sink.send(response, False)
                second.sink.send(response, False)
                second.sink.send(None, True)
                assert second.sink.done

        running_first = asyncio.create_task(run_first())
        await settle()  # the first turn is taken before the second
        running_second = asyncio.create_task(run_second())
        await settle()
        assert log == []  # the second turn finished; it waits for the first
        assert not running_second.done()
        first_turn_done.set()
        await asyncio.gather(running_first, running_second)
        assert log == [
            ("first", "error"),
            ("second", "response"),
            ("second", "response"),
            ("second", "final"),
        ]

    run_scenario(scenario)


def test_a_turn_that_raises_still_releases_the_turns_behind_it() -> None:
    async def scenario() -> None:
        log: Log = []
        release = OrderedRelease()
        first, second = _request("first", log), _request("second", log)

        async def failing() -> None:
            async with release.turn([first]):
                raise RuntimeError("the instance broke")

        async def answering() -> None:
            async with release.turn([second]):
                assert second.sink is not None
                second.sink.send(None, True)

        results = await asyncio.gather(failing(), answering(), return_exceptions=True)
        assert isinstance(results[0], RuntimeError) and results[1] is None
        assert log == [("second", "final")]

    run_scenario(scenario)
