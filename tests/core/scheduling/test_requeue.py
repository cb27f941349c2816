"""Instances whose worker process dies and restarts, in-process: what the schedulers do.

`DyingInstance` plays a worker process that runs one execution at a time and may be handed
more ahead (`pipeline_depth`); the test decides when each runs, when the process dies (the
execution it was running fails, those waiting behind it are handed back with
`Responder.requeue`) and when it is back (`serving`). So the tests assert which requests ran
where and in which order, never how long anything took.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence

from coreserve.backend.responder import Responder
from coreserve.errors import CancelledError, InternalError, UnavailableError
from coreserve.protos.model_config_pb2 import ModelConfig
from coreserve.repository.model import ModelState, ModelVersion
from coreserve.scheduling._dynamic import DynamicBatcher
from coreserve.scheduling._scheduler import Scheduler
from coreserve.scheduling.sequence._batcher import SequenceBatcher
from coreserve.types import InferenceRequest
from support.scheduling_doubles import (
    finish,
    make_request,
    model_config,
    recording_sink,
    run_scenario,
    settle,
    signature_and_statistics,
)

Log = list[tuple[str, str]]
TENSORS = (
    'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ] '
    'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ] '
)
CRASHED = InternalError("the process died running this request")
NOT_STARTED = InternalError("the process died before it ran this request")


class DyingInstance:
    """A worker-process instance: executions wait in it, in order, until the test runs them
    (`run_next`) or kills the process (`die`); with `answering` it runs each at once."""

    def __init__(self, name: str, depth: int = 1) -> None:
        self.name = name
        self.pipeline_depth = depth
        self.serving = asyncio.Event()
        self.serving.set()
        self.answering = False
        self.batches: list[list[str]] = []  # as handed to it
        self.ran: list[str] = []  # the requests it answered, in order
        self._waiting: deque[asyncio.Future[str]] = deque()

    async def execute(self, requests: Sequence[InferenceRequest], responder: Responder) -> None:
        self.batches.append([request.id for request in requests])
        outcome = "ran"
        if not self.answering:
            waiting = asyncio.get_running_loop().create_future()
            self._waiting.append(waiting)
            outcome = await waiting
        for request in requests:
            if outcome == "ran":
                self.ran.append(request.id)
                responder.send(request, {"OUT": request.inputs["IN"]})
            elif outcome == "crashed":
                responder.send_error(request, CRASHED)
            else:
                responder.requeue(request, NOT_STARTED)

    def run_next(self) -> None:
        self._waiting.popleft().set_result("ran")

    def die(self, running_started: bool = True) -> None:
        """The process dies: the execution it was running fails (unless it had not started it
        yet), those behind it go back; nothing more is given until `restart`."""
        self.serving.clear()
        if self._waiting:
            self._waiting.popleft().set_result("crashed" if running_started else "not started")
        while self._waiting:
            self._waiting.popleft().set_result("not started")

    def restart(self, answering: bool = True) -> None:
        self.answering = answering
        self.serving.set()

    async def close(self) -> None:
        return None


def _config(max_batch_size: int, scheduling: str = "") -> ModelConfig:
    return model_config(f'name: "m" max_batch_size: {max_batch_size} {TENSORS} {scheduling}')


def _scheduler(instances: list[DyingInstance]) -> Scheduler:
    signature, statistics = signature_and_statistics(_config(0))
    return Scheduler(signature, statistics, instances)


def _outcomes(requests: Sequence[InferenceRequest]) -> dict[str, str]:
    """Each request's end: 'ok', the error's class name, or 'open'."""
    result = {}
    for request in requests:
        sink = recording_sink(request)
        result[request.id] = (
            type(sink.error).__name__ if sink.error is not None else "ok" if sink.done else "open"
        )
    return result


def test_the_requests_waiting_in_a_dead_process_run_after_its_restart_in_order() -> None:
    async def scenario() -> None:
        instance = DyingInstance("instance0", depth=4)
        scheduler = _scheduler([instance])
        scheduler.start()
        log: Log = []
        requests = [make_request(name, log) for name in "abcde"]
        for request in requests:
            scheduler.submit(request)
        await settle()
        assert instance.batches == [["a"], ["b"], ["c"], ["d"]]  # b, c and d handed ahead
        assert scheduler.queue_size == 1  # e
        instance.die()
        await settle()
        # a was running: it fails; b, c and d are back in the queue, in order, ahead of e.
        assert _outcomes(requests) == {
            "a": "InternalError",
            "b": "open",
            "c": "open",
            "d": "open",
            "e": "open",
        }
        assert recording_sink(requests[0]).error is CRASHED
        assert scheduler.queue_size == 4
        late = make_request("f", log)
        scheduler.submit(late)
        await settle()
        assert scheduler.queue_size == 5 and len(instance.batches) == 4  # nothing given while down
        instance.restart()
        await settle()
        assert instance.ran == ["b", "c", "d", "e", "f"]
        assert _outcomes([*requests, late]) == dict(a="InternalError", b="ok", c="ok", d="ok", e="ok", f="ok")
        statistics = scheduler.statistics
        # The batches handed back were no executions: a's failure and the five that ran.
        assert statistics.execution_count == 6 and statistics.inference_count == 5
        assert statistics.failures["BACKEND"] == 1
        await finish(scheduler)

    run_scenario(scenario)


def test_a_living_instance_serves_what_a_dead_one_hands_back_and_what_arrives_meanwhile() -> None:
    async def scenario() -> None:
        dying, living = DyingInstance("instance0", depth=4), DyingInstance("instance1", depth=4)
        scheduler = _scheduler([dying, living])
        scheduler.start()
        log: Log = []
        requests = [make_request(name, log) for name in "abcdef"]
        for request in requests:
            scheduler.submit(request)
        await settle()
        given = [batch[0] for batch in dying.batches]
        assert len(given) >= 2, "the test needs a request waiting behind the running one"
        living.answering = True
        for _ in living.batches:
            living.run_next()
        dying.die()
        await settle()
        late = make_request("g", log)
        scheduler.submit(late)  # the dead instance's workers wait: it goes to the living one
        await settle()
        assert [batch[0] for batch in dying.batches] == given  # nothing more went to it
        outcomes = _outcomes([*requests, late])
        assert outcomes.pop(given[0]) == "InternalError"
        assert set(outcomes.values()) == {"ok"}
        assert set(given[1:]) <= set(living.ran) and "g" in living.ran
        await finish(scheduler)

    run_scenario(scenario)


def test_a_request_for_which_an_idle_dead_instance_was_woken_goes_to_another() -> None:
    async def scenario() -> None:
        dead, living = DyingInstance("instance0"), DyingInstance("instance1")
        living.answering = True
        scheduler = _scheduler([dead, living])
        scheduler.start()
        await settle()  # both wait for work, instance0's worker the longest
        dead.die()  # while idle
        log: Log = []
        request = make_request("a", log)
        scheduler.submit(request)  # wakes instance0's worker, which hands the work on
        await settle()
        assert dead.batches == [] and living.ran == ["a"]
        assert _outcomes([request]) == {"a": "ok"}
        await finish(scheduler)

    run_scenario(scenario)


def test_a_request_cancelled_while_it_waited_in_the_dead_process_leaves_as_cancelled() -> None:
    async def scenario() -> None:
        instance = DyingInstance("instance0", depth=2)
        scheduler = _scheduler([instance])
        scheduler.start()
        log: Log = []
        running, waiting = make_request("a", log), make_request("b", log)
        scheduler.submit(running)
        scheduler.submit(waiting)
        await settle()
        waiting.cancel()  # taken by the instance already: it stays there
        instance.die()
        await settle()
        assert isinstance(recording_sink(waiting).error, CancelledError)
        assert scheduler.queue_size == 0 and scheduler.statistics.failures["CANCELED"] == 1
        instance.restart()
        await finish(scheduler)
        assert instance.ran == []

    run_scenario(scenario)


def test_a_version_whose_instances_all_restart_takes_requests_but_is_not_ready() -> None:
    async def scenario() -> None:
        instances = [DyingInstance("instance0"), DyingInstance("instance1")]
        scheduler = _scheduler(instances)
        signature, statistics = scheduler.signature, scheduler.statistics
        config = _config(0)
        version = ModelVersion("m", 1, config, signature, statistics, ModelState.READY, scheduler=scheduler)
        seen = [(version.ready, version.takes_requests, version.current_state)]
        instances[0].die()
        seen.append((version.ready, version.takes_requests, version.current_state))
        instances[1].die()
        seen.append((version.ready, version.takes_requests, version.current_state))
        instances[1].restart()
        seen.append((version.ready, version.takes_requests, version.current_state))
        # Ready while one instance serves; the index's state stays READY, as Triton's does.
        assert seen == [
            (True, True, ModelState.READY),
            (True, True, ModelState.READY),
            (False, True, ModelState.READY),
            (True, True, ModelState.READY),
        ]

    run_scenario(scenario)


def _dynamic(timeout_us: int = 0, ordered: bool = False) -> tuple[DynamicBatcher, DyingInstance]:
    policy = f"default_queue_policy {{ default_timeout_microseconds: {timeout_us} }}" if timeout_us else ""
    order = "preserve_ordering: true" if ordered else ""
    config = _config(4, f"dynamic_batching {{ {policy} {order} }}")
    signature, statistics = signature_and_statistics(config)
    instance = DyingInstance("instance0")
    return DynamicBatcher(signature, statistics, [instance], config.dynamic_batching), instance


def test_the_dynamic_batcher_puts_a_handed_back_request_ahead_of_younger_ones() -> None:
    async def scenario() -> None:
        batcher, instance = _dynamic()
        batcher.start()
        log: Log = []
        first = make_request("a", log)
        batcher.submit(first)
        await settle()
        assert instance.batches == [["a"]]
        younger = make_request("b", log)
        batcher.submit(younger)  # waits: the instance runs one batch at a time
        await settle()
        instance.die(running_started=False)  # it died before it started a's batch
        await settle()
        assert batcher.queue_size == 2
        instance.restart()
        await settle()
        assert instance.batches[-1] == ["a", "b"] and instance.ran == ["a", "b"]
        await finish(batcher)

    run_scenario(scenario)


def test_with_preserve_ordering_a_handed_back_request_is_answered_in_its_new_batch() -> None:
    # The batch's turn holds each request's responses until it ends, and is released once: a
    # request queued again must answer through its new batch's turn, not the old one's.
    async def scenario() -> None:
        batcher, instance = _dynamic(ordered=True)
        batcher.start()
        log: Log = []
        requests = [make_request(name, log) for name in ("a", "b")]
        sinks = [recording_sink(request) for request in requests]  # turns wrap them meanwhile
        batcher.submit(requests[0])
        await settle()
        batcher.submit(requests[1])
        await settle()
        instance.die(running_started=False)
        await settle()
        instance.restart()
        await settle()
        assert instance.ran == ["a", "b"]
        assert [(sink.done, sink.error) for sink in sinks] == [(True, None), (True, None)]
        await finish(batcher)

    run_scenario(scenario)


def test_with_preserve_ordering_a_request_handed_back_counts_once_while_its_batch_waits_its_turn() -> None:
    # b's batch, handed back by a dead instance, waits for a's turn to end: b is queued again
    # meanwhile, and counts as queued, not as executing too.
    async def scenario() -> None:
        config = _config(4, "dynamic_batching { preserve_ordering: true }")
        signature, statistics = signature_and_statistics(config)
        instances = [DyingInstance("instance0"), DyingInstance("instance1")]
        batcher = DynamicBatcher(signature, statistics, instances, config.dynamic_batching)
        batcher.start()
        log: Log = []
        batcher.submit(make_request("a", log))
        await settle()
        batcher.submit(make_request("b", log))
        await settle()
        first, second = instances if instances[0].batches == [["a"]] else instances[::-1]
        assert (first.batches, second.batches) == ([["a"]], [["b"]])
        second.die(running_started=False)
        await settle()
        assert (batcher.queue_size, batcher.executing, batcher.in_flight) == (1, 1, 2)
        first.run_next()  # a's turn ends; b's batch ends with it; first takes b
        await settle()
        assert (first.batches[-1], batcher.queue_size, batcher.executing) == (["b"], 0, 1)
        first.run_next()
        await settle()
        assert (first.ran, batcher.in_flight) == (["a", "b"], 0)
        second.restart()
        await finish(batcher)

    run_scenario(scenario)


def test_a_handed_back_request_still_times_out_in_the_queue_while_no_instance_serves() -> None:
    async def scenario() -> None:
        batcher, instance = _dynamic(timeout_us=100_000)
        batcher.start()
        log: Log = []
        request = make_request("a", log)
        batcher.submit(request)
        await settle()
        instance.die(running_started=False)
        await asyncio.sleep(1.0)  # ten times its timeout, which counts from when it first queued
        error = recording_sink(request).error
        assert isinstance(error, UnavailableError) and error.message.startswith("Request timeout expired")
        assert batcher.queue_size == 0 and batcher.statistics.failures["REJECTED"] == 1
        instance.restart()
        await finish(batcher)
        assert instance.ran == []

    run_scenario(scenario)


def test_the_sequence_batcher_fails_a_handed_back_step_with_the_instance_error() -> None:
    async def scenario() -> None:
        config = _config(1, "sequence_batching { max_sequence_idle_microseconds: 600000000 }")
        signature, statistics = signature_and_statistics(config)
        instance = DyingInstance("instance0")
        batcher = SequenceBatcher(signature, statistics, [instance], config.sequence_batching, None)
        batcher.start()
        log: Log = []
        first = make_request("a", log, sequence_id=7, sequence_start=True)
        batcher.submit(first)
        await settle()
        instance.die(running_started=False)
        await settle()
        # Its sequence's state lived in the dead process: it is not run again elsewhere.
        assert recording_sink(first).error is NOT_STARTED
        instance.restart()
        await finish(batcher)
        assert instance.ran == []

    run_scenario(scenario)
