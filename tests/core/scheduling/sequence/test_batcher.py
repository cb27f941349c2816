"""The sequence batcher in-process: one request of a sequence at a time, in order, on one instance.

The instances record every batch (tests/support/scheduling_doubles.py); the test queues requests
before the batcher starts, or while a held request keeps a slot busy, so the batches below
follow from the queue alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from coreserve.backend.responder import Responder
from coreserve.errors import CancelledError, InvalidArgumentError, UnavailableError
from coreserve.scheduling.sequence._batcher import SequenceBatcher
from coreserve.types import InferenceRequest
from support.scheduling_doubles import (
    RecordingInstance,
    finish,
    make_request,
    model_config,
    recording_sink,
    run_scenario,
    settle,
    signature_and_statistics,
)

Log = list[tuple[str, str]]
FOREVER_US = 600_000_000
CONTROLS = """
control_input [
  { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
  { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
  { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
]
"""


class Accumulator(RecordingInstance):
    """Answers OUT = the sequence's running total (its implicit state ACC) plus IN."""

    async def execute(self, requests: Sequence[InferenceRequest], responder: Responder) -> None:
        self.batches.append([request.id for request in requests])
        self.requests.extend(requests)
        for request in requests:
            total = request.inputs["ACC_IN"] + request.inputs["IN"]
            responder.send(request, {"OUT": total, "ACC_OUT": total})


def _batcher(
    strategy: str = "", *, max_batch: int = 2, instances: int = 1, state: str = ""
) -> tuple[SequenceBatcher, list[RecordingInstance]]:
    config = model_config(
        f'name: "m" max_batch_size: {max_batch} '
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ] '
        'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ] '
        f"sequence_batching {{ max_sequence_idle_microseconds: {FOREVER_US} {strategy} {CONTROLS} {state} }}"
    )
    signature, statistics = signature_and_statistics(config)
    kind = Accumulator if state else RecordingInstance
    recorders = [kind(f"instance{index}") for index in range(instances)]
    return SequenceBatcher(signature, statistics, recorders, config.sequence_batching, None), recorders


def _step(
    name: str, log: Log, sequence_id: int, *, start: bool = False, end: bool = False
) -> InferenceRequest:
    return make_request(name, log, sequence_id=sequence_id, sequence_start=start, sequence_end=end)


def _controls(request: InferenceRequest) -> tuple[int, int, int]:
    """The START, END and CORRID values the batcher gave a request's row."""
    inputs = request.inputs
    return int(inputs["START"][0, 0]), int(inputs["END"][0, 0]), int(inputs["CORRID"][0, 0])


def test_a_sequence_runs_one_request_at_a_time_and_sequences_share_batches() -> None:
    async def scenario() -> None:
        batcher, [instance] = _batcher()
        log: Log = []
        for request in [
            _step("a1", log, 1, start=True),
            _step("a2", log, 1),
            _step("a3", log, 1, end=True),
            _step("b1", log, 2, start=True),
            _step("b2", log, 2, end=True),
        ]:
            batcher.submit(request)
        batcher.start()
        await finish(batcher)
        assert instance.batches == [["a1", "b1"], ["a2", "b2"], ["a3"]]
        controls = {request.id: _controls(request) for request in instance.requests}
        assert controls == {
            "a1": (1, 0, 1),
            "a2": (0, 0, 1),
            "a3": (0, 1, 1),
            "b1": (1, 0, 2),
            "b2": (0, 1, 2),
        }
        assert [name for name, kind in log if kind == "final"] == ["a1", "b1", "a2", "b2", "a3"]

    run_scenario(scenario)


def test_a_sequence_stays_on_the_instance_it_started_on() -> None:
    async def scenario() -> None:
        batcher, instances = _batcher(max_batch=1, instances=2)
        log: Log = []
        batcher.start()
        for step in range(3):
            for sequence_id, name in ((1, "a"), (2, "b")):
                batcher.submit(_step(f"{name}{step}", log, sequence_id, start=step == 0, end=step == 2))
            await settle()
        await finish(batcher)
        runs = sorted([request.id for request in instance.requests] for instance in instances)
        assert runs == [["a0", "a1", "a2"], ["b0", "b1", "b2"]]

    run_scenario(scenario)


def test_a_sequence_that_finds_every_slot_taken_waits_for_one_to_free() -> None:
    async def scenario() -> None:
        batcher, [instance] = _batcher(max_batch=1)
        log: Log = []
        batcher.start()
        batcher.submit(_step("a1", log, 1, start=True))
        batcher.submit(_step("b1", log, 2, start=True, end=True))
        await settle()
        # The one slot belongs to sequence 1 until it ends, though the instance is idle.
        assert instance.batches == [["a1"]]
        batcher.submit(_step("a2", log, 1, end=True))
        await finish(batcher)
        assert instance.batches == [["a1"], ["a2"], ["b1"]]

    run_scenario(scenario)


def test_direct_waits_for_enough_ready_sequences_to_fill_its_slots() -> None:
    async def scenario() -> None:
        batcher, [instance] = _batcher(
            f"direct {{ max_queue_delay_microseconds: {FOREVER_US} minimum_slot_utilization: 1.0 }}"
        )
        log: Log = []
        batcher.start()
        batcher.submit(_step("a", log, 1, start=True, end=True))
        await settle()
        assert instance.batches == []  # one of two slots ready: it waits for the queue delay
        batcher.submit(_step("b", log, 2, start=True, end=True))
        await finish(batcher)
        assert instance.batches == [["a", "b"]]

    run_scenario(scenario)


def test_oldest_sends_a_preferred_size_at_once() -> None:
    async def scenario() -> None:
        batcher, [instance] = _batcher(
            f"oldest {{ max_candidate_sequences: 4 preferred_batch_size: [ 2 ] "
            f"max_queue_delay_microseconds: {FOREVER_US} }}",
            max_batch=4,
        )
        log: Log = []
        batcher.start()
        batcher.submit(_step("a", log, 1, start=True, end=True))
        await settle()
        assert instance.batches == []
        batcher.submit(_step("b", log, 2, start=True, end=True))
        await settle()
        assert instance.batches == [["a", "b"]]
        await finish(batcher)

    run_scenario(scenario)


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({}, "inference request to model 'm' must specify a non-zero or non-empty correlation ID"),
        ({"sequence_id": 9}, "inference request for sequence 9 to model 'm' must specify the START flag"),
        ({"sequence_id": True}, "request parameter 'sequence_id' must be an integer or a string, got True"),
        (
            {"sequence_id": 9, "sequence_start": 1},
            "'sequence_start' and 'sequence_end' must be true or false",
        ),
    ],
)
def test_a_request_without_a_usable_sequence_is_refused(parameters: dict[str, int], message: str) -> None:
    async def scenario() -> None:
        batcher, _ = _batcher()
        request = make_request("r", [], **parameters)
        with pytest.raises(InvalidArgumentError, match=message):
            batcher.submit(request)
        assert batcher.queue_size == 0

    run_scenario(scenario)


def test_a_batched_sequence_request_must_be_one_row() -> None:
    async def scenario() -> None:
        batcher, _ = _batcher()
        with pytest.raises(
            InvalidArgumentError,
            match=r"must specify batch-size 1 due to requirements of sequence batcher \(got 2\)",
        ):
            batcher.submit(make_request("r", [], rows=2, sequence_id=1, sequence_start=True))

    run_scenario(scenario)


def test_a_sequence_that_ended_says_so_to_its_next_request() -> None:
    async def scenario() -> None:
        batcher, [instance] = _batcher()
        log: Log = []
        batcher.start()
        batcher.submit(_step("only", log, 5, start=True, end=True))
        await settle()
        with pytest.raises(InvalidArgumentError) as error:
            batcher.submit(_step("late", log, 5))
        assert "(it was released: its last request (sequence_end) ran)" in str(error.value)
        batcher.submit(_step("again", log, 5, start=True, end=True))  # a new start is welcome
        await finish(batcher)
        assert instance.batches == [["only"], ["again"]]

    run_scenario(scenario)


def test_each_sequence_carries_its_own_state_from_request_to_request() -> None:
    async def scenario() -> None:
        state = 'state [ { input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]'
        batcher, [instance] = _batcher(state=state)
        log: Log = []
        plan = [  # (name, sequence id, IN, start, end)
            ("a1", 1, 1, True, False),
            ("b1", 2, 10, True, False),
            ("a2", 1, 2, False, False),
            ("b2", 2, 20, False, True),
            ("a3", 1, 3, False, True),
            ("a4", 1, 5, True, True),  # started again: from the initial state
        ]
        sinks = {}
        for name, sequence_id, value, start, end in plan:
            request = _step(name, log, sequence_id, start=start, end=end)
            request.inputs["IN"][:] = value
            sinks[name] = recording_sink(request)
            batcher.submit(request)
        batcher.start()
        await finish(batcher)
        totals = {}
        for name, sink in sinks.items():
            response = sink.responses[-1]
            assert response is not None and list(response.outputs) == ["OUT"]  # the state stays inside
            totals[name] = int(response.outputs["OUT"][0, 0])
        assert totals == {"a1": 1, "a2": 3, "a3": 6, "a4": 5, "b1": 10, "b2": 30}
        assert instance.batches == [["a1", "b1"], ["a2", "b2"], ["a3"], ["a4"]]

    run_scenario(scenario)


def test_closing_sends_at_once_the_batch_that_waits_for_more_sequences() -> None:
    async def scenario() -> None:
        # As the dynamic batcher: the queue delay (600 s) is far beyond the close's timeout.
        batcher, [instance] = _batcher(
            f"direct {{ max_queue_delay_microseconds: {FOREVER_US} minimum_slot_utilization: 1.0 }}"
        )
        log: Log = []
        batcher.start()
        batcher.submit(_step("a", log, 1, start=True, end=True))
        await settle()
        assert instance.batches == []  # one of two slots ready: it waits for the queue delay
        await batcher.close(timeout=5)
        assert instance.batches == [["a"]]
        assert log == [("a", "final")]
        assert instance.closed

    run_scenario(scenario)


def test_closing_lets_running_and_waiting_sequences_finish_then_closes_the_instance() -> None:
    async def scenario() -> None:
        batcher, [instance] = _batcher(max_batch=1)
        log: Log = []
        release = instance.holds["a1"] = asyncio.Event()
        batcher.start()
        batcher.submit(_step("a1", log, 1, start=True))
        await settle()
        batcher.submit(_step("a2", log, 1, end=True))
        batcher.submit(_step("b1", log, 2, start=True, end=True))  # waits for the one slot
        assert (batcher.queue_size, batcher.pending, batcher.executing) == (2, 2, 1)  # a1 executes
        closing = asyncio.create_task(batcher.close(timeout=30))
        await settle()
        assert not closing.done() and not instance.closed and log == []
        with pytest.raises(UnavailableError, match="model 'm' version 1 is unloading"):
            batcher.submit(_step("late", log, 3, start=True))
        release.set()
        await closing
        assert instance.batches == [["a1"], ["a2"], ["b1"]]
        assert log == [("a1", "final"), ("a2", "final"), ("b1", "final")]
        assert batcher.pending == 0 and instance.closed

    run_scenario(scenario)


def test_a_cancelled_request_leaves_with_the_waiting_requests_of_its_sequence() -> None:
    async def scenario() -> None:
        batcher, [instance] = _batcher(max_batch=1)
        log: Log = []
        release = instance.holds["a1"] = asyncio.Event()
        batcher.start()
        batcher.submit(_step("a1", log, 1, start=True))
        await settle()
        a2, a3 = _step("a2", log, 1), _step("a3", log, 1, end=True)
        batcher.submit(a2)
        batcher.submit(a3)
        a2.cancel()  # a1 runs on; a2 and a3 never run
        assert log == [("a2", "error"), ("a3", "error")]
        assert isinstance(recording_sink(a3).error, CancelledError)
        release.set()
        await settle()
        with pytest.raises(InvalidArgumentError, match=r"\(it was released: a request of it was cancelled\)"):
            batcher.submit(_step("a4", log, 1))
        await finish(batcher)
        assert instance.batches == [["a1"]]
        assert batcher.statistics.failures["CANCELED"] == 2

    run_scenario(scenario)
