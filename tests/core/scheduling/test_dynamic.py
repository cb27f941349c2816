"""The dynamic batcher in-process: which requests go together, and in which order.

Requests are queued before the batcher starts, or while a held request keeps its instance
busy, so every batch below is decided by the queue's contents, never by how fast the machine is.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from coreserve.errors import CancelledError, CoreserveError, InvalidArgumentError, UnavailableError
from coreserve.protos.model_config_pb2 import ModelQueuePolicy
from coreserve.scheduling._dynamic import DynamicBatcher, QueuePolicy
from coreserve.types import InferenceRequest
from support.scheduling_doubles import (
    RecordingInstance,
    RecordingSink,
    finish,
    make_request,
    model_config,
    recording_sink,
    run_scenario,
    settle,
    signature_and_statistics,
)

Log = list[tuple[str, str]]
# A queue delay no test waits for: a batch that is sent was sent for another reason.
FOREVER_US = 600_000_000


def _batcher(
    batching: str, max_batch: int = 8, ragged: bool = False
) -> tuple[DynamicBatcher, RecordingInstance]:
    config = model_config(
        f'name: "m" max_batch_size: {max_batch} '
        f'input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ -1 ] allow_ragged_batch: {str(ragged).lower()} }} ] '
        'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ] '
        f"dynamic_batching {{ {batching} }}"
    )
    signature, statistics = signature_and_statistics(config)
    instance = RecordingInstance()
    return DynamicBatcher(signature, statistics, [instance], config.dynamic_batching), instance


def test_queued_requests_form_batches_up_to_max_batch_size() -> None:
    async def scenario() -> None:
        batcher, instance = _batcher("", max_batch=4)
        log: Log = []
        requests = [make_request(f"r{index}", log) for index in range(10)]
        for request in requests:
            batcher.submit(request)
        batcher.start()
        await finish(batcher)
        assert instance.batches == [["r0", "r1", "r2", "r3"], ["r4", "r5", "r6", "r7"], ["r8", "r9"]]
        assert log == [(f"r{index}", "final") for index in range(10)]
        for request in requests:  # each request got exactly its own rows back
            response = recording_sink(request).responses[-1]
            assert response is not None
            np.testing.assert_array_equal(response.outputs["OUT"], request.inputs["IN"])
        assert (batcher.statistics.inference_count, batcher.statistics.execution_count) == (10, 3)

    run_scenario(scenario)


def test_a_model_that_cannot_batch_runs_each_request_alone() -> None:
    async def scenario() -> None:
        batcher, instance = _batcher("", max_batch=0)
        log: Log = []
        for index in range(3):
            batcher.submit(make_request(f"r{index}", log))
        batcher.start()
        await finish(batcher)
        assert instance.batches == [["r0"], ["r1"], ["r2"]]
        assert log == [(f"r{index}", "final") for index in range(3)]

    run_scenario(scenario)


def test_rows_count_toward_max_batch_size_and_a_request_is_never_split() -> None:
    async def scenario() -> None:
        batcher, instance = _batcher("", max_batch=4)
        log: Log = []
        for name, rows in [("a", 2), ("b", 3), ("c", 1), ("d", 4)]:
            batcher.submit(make_request(name, log, rows=rows))
        batcher.start()
        await finish(batcher)
        assert instance.batches == [["a"], ["b", "c"], ["d"]]

    run_scenario(scenario)


def test_only_requests_of_the_same_shape_share_a_batch() -> None:
    async def scenario() -> None:
        batcher, instance = _batcher("")
        log: Log = []
        for name, width in [("a", 2), ("b", 2), ("c", 3), ("d", 2)]:
            batcher.submit(make_request(name, log, width=width))
        batcher.start()
        await finish(batcher)
        # The batch stops at the first request that does not fit; order is never changed.
        assert instance.batches == [["a", "b"], ["c"], ["d"]]

    run_scenario(scenario)


def test_ragged_inputs_batch_whatever_their_lengths() -> None:
    async def scenario() -> None:
        batcher, instance = _batcher("", max_batch=3, ragged=True)
        log: Log = []
        for name, width in [("a", 2), ("b", 5), ("c", 1), ("d", 3)]:
            batcher.submit(make_request(name, log, width=width))
        batcher.start()
        await finish(batcher)
        assert instance.batches == [["a", "b", "c"], ["d"]]  # only max_batch_size cuts them

    run_scenario(scenario)


def test_the_largest_preferred_size_goes_at_once_and_the_rest_waits_for_company() -> None:
    async def scenario() -> None:
        batcher, instance = _batcher(
            f"preferred_batch_size: [ 2, 4 ] max_queue_delay_microseconds: {FOREVER_US}"
        )
        log: Log = []
        for index in range(5):
            batcher.submit(make_request(f"r{index}", log))
        batcher.start()
        await settle()
        # Five queued: four make the largest preferred size; the fifth alone is not preferred
        # and its queue delay has not run out, so it waits.
        assert instance.batches == [["r0", "r1", "r2", "r3"]]
        assert [name for name, _ in log] == ["r0", "r1", "r2", "r3"]
        for index in range(5, 8):  # three more arrive together: with r4, a preferred 4
            batcher.submit(make_request(f"r{index}", log))
        await settle()
        assert instance.batches == [["r0", "r1", "r2", "r3"], ["r4", "r5", "r6", "r7"]]
        batcher.submit(make_request("r8", log))
        batcher.submit(make_request("r9", log))
        await finish(batcher)
        assert instance.batches[2:] == [["r8", "r9"]]

    run_scenario(scenario)


def test_a_batch_as_large_as_every_preferred_size_goes_at_once_as_in_triton() -> None:
    async def scenario() -> None:
        batcher, instance = _batcher(
            f"preferred_batch_size: [ 2, 4 ] max_queue_delay_microseconds: {FOREVER_US}"
        )
        log: Log = []
        batcher.start()
        batcher.submit(make_request("six", log, rows=6))  # past every preferred size: it cannot wait for one
        await settle()
        assert instance.batches == [["six"]]
        batcher.submit(make_request("a", log, rows=3))
        batcher.submit(make_request("b", log, rows=3))
        await settle()
        # a and b would make 6, past every preferred size: a goes alone, b waits for company.
        assert instance.batches == [["six"], ["a"]]
        batcher.submit(make_request("c", log))  # b and c make a preferred 4
        await finish(batcher)
        assert instance.batches == [["six"], ["a"], ["b", "c"]]

    run_scenario(scenario)


def test_a_batch_goes_at_a_preferred_size_though_more_would_fit_as_in_triton() -> None:
    async def scenario() -> None:
        batcher, instance = _batcher(
            f"preferred_batch_size: [ 4 ] max_queue_delay_microseconds: {FOREVER_US}"
        )
        log: Log = []
        for index in range(9):
            batcher.submit(make_request(f"r{index}", log))
        batcher.start()
        await settle()
        assert instance.batches == [
            [f"r{index}" for index in range(4)],
            [f"r{index}" for index in range(4, 8)],
        ]
        await finish(batcher)  # r8 waits for company until the batcher stops
        assert instance.batches[2:] == [["r8"]]

    run_scenario(scenario)


def test_a_full_batch_goes_without_waiting_for_the_queue_delay() -> None:
    async def scenario() -> None:
        batcher, instance = _batcher(f"max_queue_delay_microseconds: {FOREVER_US}", max_batch=3)
        log: Log = []
        batcher.start()
        for index in range(2):
            batcher.submit(make_request(f"r{index}", log))
            await settle()
        assert instance.batches == []  # two of three: the batch may still grow
        batcher.submit(make_request("r2", log))
        await finish(batcher)
        assert instance.batches == [["r0", "r1", "r2"]]

    run_scenario(scenario)


def test_a_lone_request_is_sent_when_its_queue_delay_ends() -> None:
    async def scenario() -> None:
        batcher, instance = _batcher("max_queue_delay_microseconds: 20000 preferred_batch_size: [ 4 ]")
        log: Log = []
        batcher.start()
        batcher.submit(make_request("alone", log))
        while not log:  # the delay is the behaviour here; the test's own bound is run_scenario's 60 s
            await asyncio.sleep(0.01)
        assert instance.batches == [["alone"]]
        await finish(batcher)

    run_scenario(scenario)


def test_the_highest_priority_level_is_served_first() -> None:
    async def scenario() -> None:
        batcher, instance = _batcher("priority_levels: 2 default_priority_level: 2")
        log: Log = []
        batcher.submit(make_request("low0", log))
        batcher.submit(make_request("low1", log, priority=2))
        batcher.submit(make_request("high", log, priority=1))
        batcher.submit(make_request("low2", log))
        batcher.start()
        await finish(batcher)
        # As Triton's priority queue: the levels in order, and a batch goes on into the next.
        assert instance.batches == [["high", "low0", "low1", "low2"]]

    run_scenario(scenario)


def test_a_preferred_batch_takes_requests_of_several_levels_as_in_triton() -> None:
    # Triton's QA L0_model_queue test_priority_levels: level 1's two rows and the first two
    # rows of level 2 make the preferred 4 at once; the last row waits for company.
    async def scenario() -> None:
        batcher, instance = _batcher(
            "priority_levels: 2 default_priority_level: 2 preferred_batch_size: [ 4, 8 ] "
            f"max_queue_delay_microseconds: {FOREVER_US}"
        )
        log: Log = []
        batcher.start()
        batcher.submit(make_request("low_two", log, rows=2))
        batcher.submit(make_request("low_one", log))
        await settle()
        assert instance.batches == []  # 3 rows: not a preferred size
        batcher.submit(make_request("high_two", log, rows=2, priority=1))
        await settle()
        assert instance.batches == [["high_two", "low_two"]]
        await finish(batcher)
        assert instance.batches[1:] == [["low_one"]]

    run_scenario(scenario)


def test_so_many_priority_levels_take_no_room_until_used() -> None:
    # Triton's QA test_max_priority_levels: the largest uint64 of levels (a list of them never ended).
    async def scenario() -> None:
        batcher, instance = _batcher(f"priority_levels: {2**64 - 1} default_priority_level: {2**32}")
        log: Log = []
        for priority in (0, 2**63, 7, 2**32):
            batcher.submit(make_request(f"p{priority}", log, priority=priority))
        assert batcher.queue_size == 4
        batcher.start()
        await finish(batcher)
        assert instance.batches == [["p7", "p0", "p4294967296", "p9223372036854775808"]]
        assert (
            batcher.queue_size == 0 and not batcher._queues
        )  # every level's queue went with its last request

    run_scenario(scenario)


@pytest.mark.parametrize(
    ("priority", "message"),
    [
        (-1, "request parameter 'priority' must be a non-negative integer, got -1"),
        ("high", "request parameter 'priority' must be a non-negative integer, got 'high'"),
    ],
)
def test_a_priority_outside_the_levels_is_refused(priority: int | str, message: str) -> None:
    async def scenario() -> None:
        batcher, _ = _batcher("priority_levels: 2")
        with pytest.raises(InvalidArgumentError) as error:
            batcher.submit(make_request("r", [], priority=priority))
        assert str(error.value) == message
        assert batcher.queue_size == 0

    run_scenario(scenario)


def test_a_full_priority_queue_rejects_with_tritons_words() -> None:
    async def scenario() -> None:
        batcher, instance = _batcher("default_queue_policy { max_queue_size: 2 }")
        log: Log = []
        batcher.submit(make_request("a", log))
        batcher.submit(make_request("b", log))
        with pytest.raises(UnavailableError) as error:
            batcher.submit(make_request("c", log))
        assert str(error.value).startswith("[request id: c] Exceeds maximum queue size: model 'm'")
        assert batcher.statistics.failures["REJECTED"] == 0  # as Triton: it never got into the model
        batcher.start()
        await finish(batcher)
        assert instance.batches == [["a", "b"]]

    run_scenario(scenario)


def test_without_priority_levels_the_per_level_policies_are_not_read() -> None:
    async def scenario() -> None:  # as Triton: the default queue policy holds
        batcher, instance = _batcher("priority_queue_policy { key: 1 value { max_queue_size: 1 } }")
        log: Log = []
        for name in "abc":
            batcher.submit(make_request(name, log))
        batcher.start()
        await finish(batcher)
        assert instance.batches == [["a", "b", "c"]]

    run_scenario(scenario)


async def _busy_with(batcher: DynamicBatcher, instance: RecordingInstance, log: Log) -> asyncio.Event:
    """Starts the batcher with request 'busy' held on its instance; returns what releases it."""
    release = asyncio.Event()
    instance.holds["busy"] = release
    batcher.start()
    batcher.submit(make_request("busy", log))
    await settle()
    assert instance.batches == [["busy"]]
    return release


async def _after_timers_of(timeout_us: int) -> None:
    # asyncio runs timers in deadline order: once this later one has fired, so has every
    # queue timeout of `timeout_us` set before it, however slow the machine.
    await asyncio.sleep(timeout_us / 1e6 + 0.05)


def test_a_request_that_waits_past_its_timeout_is_rejected() -> None:
    async def scenario() -> None:
        batcher, instance = _batcher("default_queue_policy { default_timeout_microseconds: 1000 }")
        log: Log = []
        release = await _busy_with(batcher, instance, log)
        late = make_request("late", log)
        batcher.submit(late)
        await _after_timers_of(1000)
        assert log == [("late", "error")]
        error = recording_sink(late).error
        assert isinstance(error, UnavailableError)
        assert str(error) == (
            "Request timeout expired: the request waited in model 'm''s queue of priority level 1 past its timeout"
        )
        release.set()
        await finish(batcher)
        assert instance.batches == [["busy"]]
        assert log == [("late", "error"), ("busy", "final")]
        assert batcher.statistics.failures["REJECTED"] == 1

    run_scenario(scenario)


def test_a_delayed_request_goes_behind_the_requests_of_its_level_that_did_not_time_out() -> None:
    async def scenario() -> None:
        batcher, instance = _batcher(
            "default_queue_policy { timeout_action: DELAY allow_timeout_override: true "
            f"default_timeout_microseconds: {FOREVER_US} }}"
        )
        log: Log = []
        release = await _busy_with(batcher, instance, log)
        batcher.submit(make_request("impatient", log, timeout=1000))
        batcher.submit(make_request("patient", log))
        await _after_timers_of(1000)
        batcher.submit(make_request("newcomer", log))
        release.set()
        await finish(batcher)
        assert instance.batches == [["busy"], ["patient", "newcomer", "impatient"]]
        assert batcher.statistics.failures["REJECTED"] == 0

    run_scenario(scenario)


def test_a_delayed_request_goes_before_the_next_levels_requests_as_in_triton() -> None:
    async def scenario() -> None:
        batcher, instance = _batcher(
            "priority_levels: 2 default_priority_level: 2 priority_queue_policy { key: 1 value { "
            "timeout_action: DELAY default_timeout_microseconds: 1000 } }"
        )
        log: Log = []
        release = await _busy_with(batcher, instance, log)
        batcher.submit(make_request("second_level", log, priority=2))
        batcher.submit(make_request("first_level_late", log, priority=1))
        await _after_timers_of(1000)
        release.set()
        await finish(batcher)
        assert instance.batches == [["busy"], ["first_level_late", "second_level"]]

    run_scenario(scenario)


def test_delayed_requests_count_toward_their_levels_max_queue_size_as_in_triton() -> None:
    async def scenario() -> None:
        batcher, instance = _batcher(
            "default_queue_policy { max_queue_size: 2 timeout_action: DELAY default_timeout_microseconds: 1000 }"
        )
        log: Log = []
        release = await _busy_with(batcher, instance, log)
        batcher.submit(make_request("a", log))
        batcher.submit(make_request("b", log))
        await _after_timers_of(1000)  # both delayed: they still hold the level's two places
        with pytest.raises(UnavailableError, match="Exceeds maximum queue size"):
            batcher.submit(make_request("c", log))
        release.set()
        await finish(batcher)
        assert instance.batches == [["busy"], ["a", "b"]]

    run_scenario(scenario)


def test_a_request_delayed_by_its_timeout_lets_the_batch_behind_it_go_at_once() -> None:
    # Triton's QA test_priority_with_policy: rows 2, 1, 2 reach no preferred size; once the
    # row in the middle times out (DELAY), 2 and 2 make the preferred 4 and go at once.
    async def scenario() -> None:
        batcher, instance = _batcher(
            f"preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: {FOREVER_US} "
            "default_queue_policy { timeout_action: DELAY allow_timeout_override: true "
            f"default_timeout_microseconds: {FOREVER_US} }}"
        )
        log: Log = []
        batcher.start()
        batcher.submit(make_request("first", log, rows=2))
        batcher.submit(make_request("impatient", log, timeout=1000))
        batcher.submit(make_request("second", log, rows=2))
        await _after_timers_of(1000)
        await settle()
        assert instance.batches == [["first", "second"]]
        await finish(batcher)
        assert instance.batches[1:] == [["impatient"]]

    run_scenario(scenario)


@pytest.mark.parametrize(
    ("allow", "default_us", "requested", "expected"),
    [
        (False, 500, 100, 500),  # no overrides: the policy's
        (True, 500, 100, 100),  # shorter: taken
        (True, 500, 900, 500),  # longer: only shortens
        (True, 0, 900, 0),  # no default: none, as Triton's PriorityQueue reads it (900 < 0 is false)
        (True, 500, 0, 500),
        (True, 500, True, 500),  # not an integer
    ],
)
def test_a_request_may_only_shorten_its_queue_timeout(
    allow: bool, default_us: int, requested: int, expected: int
) -> None:
    policy = QueuePolicy.from_config(
        ModelQueuePolicy(default_timeout_microseconds=default_us, allow_timeout_override=allow)
    )
    request = InferenceRequest("m", {}, parameters={"timeout": requested})
    assert policy.timeout_for(request) == expected


def test_a_cancelled_request_leaves_the_queue_and_never_runs() -> None:
    async def scenario() -> None:
        batcher, instance = _batcher("")
        log: Log = []
        release = await _busy_with(batcher, instance, log)
        gone = make_request("gone", log)
        batcher.submit(gone)
        batcher.submit(make_request("kept", log))
        gone.cancel()
        assert log == [("gone", "error")]
        assert isinstance(recording_sink(gone).error, CancelledError)
        release.set()
        await finish(batcher)
        assert instance.batches == [["busy"], ["kept"]]
        assert batcher.statistics.failures["CANCELED"] == 1

    run_scenario(scenario)


def test_closing_lets_the_running_batch_finish_then_closes_the_instance() -> None:
    async def scenario() -> None:
        batcher, instance = _batcher("")
        log: Log = []
        release = await _busy_with(batcher, instance, log)
        closing = asyncio.create_task(batcher.close(timeout=30))
        await settle()
        assert not closing.done() and not instance.closed and log == []
        with pytest.raises(UnavailableError, match="model 'm' version 1 is unloading"):
            batcher.submit(make_request("after", log))
        release.set()
        await closing
        assert log == [("busy", "final")]
        assert instance.closed

    run_scenario(scenario)


def test_closing_sends_at_once_the_batch_that_waits_for_its_queue_delay() -> None:
    async def scenario() -> None:
        # As Triton drains its queue on unload: the delay (600 s) is far beyond the close's timeout.
        batcher, instance = _batcher(f"max_queue_delay_microseconds: {FOREVER_US}", max_batch=4)
        log: Log = []
        batcher.start()
        for index in range(2):
            batcher.submit(make_request(f"r{index}", log))
        await settle()
        assert instance.batches == []  # two of four: waiting for company
        await batcher.close(timeout=5)
        assert instance.batches == [["r0", "r1"]]
        assert log == [("r0", "final"), ("r1", "final")]
        assert instance.closed

    run_scenario(scenario)


class _EndsAnother(RecordingSink):
    """A sink whose failure withdraws another queued request (a BLS parent cancelling its child)."""

    def __init__(self, request_id: str, log: Log, batcher: DynamicBatcher, other: InferenceRequest) -> None:
        super().__init__(request_id, log)
        self._batcher = batcher
        self._other = other

    def fail(self, error: CoreserveError) -> None:
        super().fail(error)
        self._other.cancel()
        self._batcher.withdraw(self._other)


def test_closing_fails_what_stays_queued_even_where_a_failure_empties_a_queue() -> None:
    async def scenario() -> None:
        batcher, instance = _batcher("")
        log: Log = []
        await _busy_with(batcher, instance, log)  # held past the close's timeout
        child = make_request("child", log)
        parent = make_request("parent", log)
        parent.sink = _EndsAnother("parent", log, batcher, child)
        batcher.submit(parent)
        batcher.submit(child)
        await batcher.close(timeout=0.2)  # the drain fails the parent, which withdraws the child
        assert log == [("parent", "error"), ("child", "error")]
        assert isinstance(recording_sink(child).error, CancelledError)
        assert instance.closed

    run_scenario(scenario)
