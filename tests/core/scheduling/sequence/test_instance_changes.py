"""The sequence batcher's instances added and retired in place, in-process (Triton's rule): an
added instance takes new sequences, those waiting for a slot first; a retired one takes none and
serves the sequences it holds until they end, then closes, once."""

from __future__ import annotations

import asyncio

from coreserve.scheduling.sequence._batcher import SequenceBatcher
from coreserve.types import InferenceRequest
from support.scheduling_doubles import (
    RecordingInstance,
    finish,
    make_request,
    model_config,
    run_scenario,
    settle,
    signature_and_statistics,
)

Log = list[tuple[str, str]]


class Closing(RecordingInstance):
    """Counts its closes."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.closes = 0

    async def close(self) -> None:
        self.closes += 1
        await super().close()


def _batcher(count: int) -> tuple[SequenceBatcher, list[Closing]]:
    config = model_config(
        'name: "m" max_batch_size: 0 '
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ] '
        'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ] '
        "sequence_batching { max_sequence_idle_microseconds: 600000000 }"
    )
    signature, statistics = signature_and_statistics(config)
    instances = [Closing(f"instance{index}") for index in range(count)]
    return SequenceBatcher(signature, statistics, instances, config.sequence_batching, None), instances


def _step(
    name: str, log: Log, sequence_id: int, *, start: bool = False, end: bool = False
) -> InferenceRequest:
    return make_request(name, log, sequence_id=sequence_id, sequence_start=start, sequence_end=end)


def _ran(instance: Closing) -> list[str]:
    return [request_id for batch in instance.batches for request_id in batch]


def test_a_retired_instance_serves_the_sequence_it_holds_then_closes_once() -> None:
    async def scenario() -> None:
        batcher, (first, second) = _batcher(2)
        batcher.start()
        log: Log = []
        batcher.submit(_step("a1", log, 1, start=True))  # the first instance's one slot
        await settle()
        # Retired while it holds sequence 1: the call returns, and the instance stays.
        assert await batcher.retire_instances([first]) is True
        assert first.closes == 0 and first in batcher.instances
        batcher.submit(_step("b1", log, 2, start=True))  # on the second: the first takes no new one
        batcher.submit(_step("a2", log, 1))
        await settle()
        assert (_ran(first), _ran(second)) == (["a1", "a2"], ["b1"])
        assert first.closes == 0
        batcher.submit(_step("a3", log, 1, end=True))
        await settle()
        assert _ran(first) == ["a1", "a2", "a3"]
        assert first.closes == 1 and first not in batcher.instances
        await finish(batcher)
        assert (first.closes, second.closes) == (1, 1)
        assert [event for _, event in log] == ["final"] * 4

    run_scenario(scenario)


def test_an_instance_that_holds_no_sequence_closes_before_the_retirement_returns() -> None:
    async def scenario() -> None:
        batcher, (first, second) = _batcher(2)
        batcher.start()
        log: Log = []
        batcher.submit(_step("a1", log, 1, start=True, end=True))
        await settle()
        assert await batcher.retire_instances([second]) is True
        assert second.closes == 1 and batcher.instances == [first]
        await finish(batcher)
        assert (first.closes, second.closes) == (1, 1)

    run_scenario(scenario)


def test_a_sequence_waiting_for_a_slot_takes_an_added_instance() -> None:
    async def scenario() -> None:
        batcher, (first,) = _batcher(1)
        batcher.start()
        log: Log = []
        batcher.submit(_step("a1", log, 1, start=True))
        batcher.submit(_step("b1", log, 2, start=True))  # waits: the only slot is sequence 1's
        await settle()
        assert _ran(first) == ["a1"] and batcher.queue_size == 1
        added = Closing("added")
        batcher.add_instances([added])
        await settle()
        assert _ran(added) == ["b1"] and batcher.queue_size == 0
        await finish(batcher)

    run_scenario(scenario)


def test_closing_while_a_retired_instance_holds_a_sequence_closes_it_once() -> None:
    async def scenario() -> None:
        batcher, (first, second) = _batcher(2)
        batcher.start()
        log: Log = []
        batcher.submit(_step("a1", log, 1, start=True))
        await settle()
        await batcher.retire_instances([first])
        assert await asyncio.wait_for(batcher.close(timeout=30), 30) is True
        assert (first.closes, second.closes) == (1, 1)

    run_scenario(scenario)
