"""A serving scheduler's instances added and retired in place (a reload that changed only
`instance_group`), in-process: which instance runs what, and when a retired one closes. The
instances run an execution only when the test says, so nothing here depends on timing."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence

from google.protobuf import text_format

from coreserve.backend.api import InstanceKind, InstancePlacement
from coreserve.backend.responder import Responder
from coreserve.protos.model_config_pb2 import ModelInstanceGroup, ModelRateLimiter
from coreserve.repository._instances import instance_key, plan_instance_changes
from coreserve.scheduling._dynamic import DynamicBatcher
from coreserve.scheduling._scheduler import Scheduler
from coreserve.scheduling.rate_limiter import RateLimiter
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

TENSORS = (
    'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ] '
    'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ] '
)


class GatedInstance:
    """Runs each execution when the test calls `run_next`; records what it ran and its close."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.ran: list[str] = []
        self.closes = 0
        self._waiting: deque[asyncio.Future[None]] = deque()

    @property
    def closed(self) -> bool:
        return self.closes > 0

    @property
    def running(self) -> int:
        return len(self._waiting)

    async def execute(self, requests: Sequence[InferenceRequest], responder: Responder) -> None:
        waiting = asyncio.get_running_loop().create_future()
        self._waiting.append(waiting)
        await waiting
        for request in requests:
            self.ran.append(request.id)
            responder.send(request, {"OUT": request.inputs["IN"]})

    def run_next(self) -> None:
        self._waiting.popleft().set_result(None)

    async def close(self) -> None:
        self.closes += 1


def _scheduler(instances: list[GatedInstance], batching: bool = False) -> Scheduler:
    scheduling = "dynamic_batching { }" if batching else ""
    config = model_config(f'name: "m" max_batch_size: {4 if batching else 0} {TENSORS} {scheduling}')
    signature, statistics = signature_and_statistics(config)
    if batching:
        return DynamicBatcher(signature, statistics, instances, config.dynamic_batching)
    return Scheduler(signature, statistics, instances)


def test_a_retired_instance_ends_its_execution_then_closes_while_the_others_serve() -> None:
    async def scenario() -> None:
        first, second = GatedInstance("first"), GatedInstance("second")
        scheduler = _scheduler([first, second])
        scheduler.start()
        log: list[tuple[str, str]] = []
        a, b = make_request("a", log), make_request("b", log)
        scheduler.submit(a)
        scheduler.submit(b)
        await settle()
        assert first.running == 1 and second.running == 1
        retiring = asyncio.ensure_future(scheduler.retire_instances([first]))
        await settle()
        assert not retiring.done() and not first.closed  # its execution runs on
        c = make_request("c", log)
        scheduler.submit(c)
        await settle()
        first.run_next()
        assert await retiring is True
        assert first.closed and scheduler.instances == [second]
        second.run_next()
        await settle()
        second.run_next()
        await settle()
        assert first.ran == ["a"] and second.ran == ["b", "c"]
        assert all(recording_sink(request).done for request in (a, b, c))
        await finish(scheduler)
        assert second.closed

    run_scenario(scenario)


def test_an_idle_instance_retires_at_once_and_an_added_one_takes_what_waits() -> None:
    async def scenario() -> None:
        first, second = GatedInstance("first"), GatedInstance("second")
        scheduler = _scheduler([first, second], batching=True)
        scheduler.start()
        await settle()
        assert await scheduler.retire_instances([second]) is True
        assert second.closed and scheduler.instances == [first]
        log: list[tuple[str, str]] = []
        a, b = make_request("a", log), make_request("b", log)
        scheduler.submit(a)
        await settle()
        scheduler.submit(b)  # waits: the one instance runs a
        await settle()
        assert scheduler.queue_size == 1
        third = GatedInstance("third")
        scheduler.add_instances([third])
        await settle()
        assert scheduler.queue_size == 0 and third.running == 1
        first.run_next()
        third.run_next()
        await settle()
        assert first.ran == ["a"] and third.ran == ["b"] and second.ran == []
        await finish(scheduler)
        assert third.closed and first.closed

    run_scenario(scenario)


def test_a_retiring_instance_waiting_for_its_rate_limiter_turn_still_runs_its_request() -> None:
    async def scenario() -> None:
        first, second = GatedInstance("first"), GatedInstance("second")
        scheduler = _scheduler([first, second])
        limiter = RateLimiter()
        one = text_format.Parse('resources [ { name: "R1" count: 1 global: true } ]', ModelRateLimiter())
        scheduler.limit_rate(limiter, limiter.register("m", [(one, 0), (one, 0)]))
        scheduler.start()
        log: list[tuple[str, str]] = []
        a, b = make_request("a", log), make_request("b", log)
        scheduler.submit(a)
        scheduler.submit(b)
        await settle()
        assert first.running + second.running == 1  # one R1: the other waits for its turn
        waiting, running = (second, first) if first.running else (first, second)
        retiring = asyncio.ensure_future(scheduler.retire_instances([waiting]))
        await settle()
        assert not retiring.done()
        running.run_next()
        await settle()
        waiting.run_next()  # its turn came: it runs the request it took, then leaves
        assert await retiring is True
        assert all(recording_sink(request).done for request in (a, b))
        assert waiting.closes == 1 and scheduler.instances == [running]
        c = make_request("c", log)
        scheduler.submit(c)
        await settle()
        running.run_next()
        await settle()
        assert recording_sink(c).done and running.ran[-1] == "c"
        await finish(scheduler)
        assert waiting.closes == 1 and running.closes == 1  # the scheduler's close closes each once
        assert await scheduler.retire_instances([waiting]) is True and waiting.closes == 1

    run_scenario(scenario)


def _placement(
    name: str, index: int, kind: InstanceKind = InstanceKind.CPU, device: int = 0
) -> InstancePlacement:
    return InstancePlacement(f"{name}_{index}", name, index, kind, device)


def _cpu_group(name: str, count: int, priority: int = 0) -> ModelInstanceGroup:
    group = ModelInstanceGroup(name=name, kind=ModelInstanceGroup.KIND_CPU, count=count)
    if priority:
        group.rate_limiter.priority = priority
    return group


def test_alike_instances_are_kept_from_the_last_placed_and_the_rest_planned() -> None:
    old = _cpu_group("old", 3)
    placed = [(instance_key(old, _placement("old", i)), f"instance{i}") for i in range(3)]
    # Renamed and regrouped, the same settings: every instance stays.
    renamed = [(_cpu_group("one", 1), _placement("one", 0))] + [
        (_cpu_group("two", 2), _placement("two", i)) for i in range(2)
    ]
    kept, create, retire = plan_instance_changes(placed, renamed)  # type: ignore[arg-type]
    assert [instance for _, instance in kept] == ["instance2", "instance1", "instance0"]
    assert create == [] and retire == []
    # Fewer: the last placed stay, as Triton keeps them.
    kept, create, retire = plan_instance_changes(placed, [(old, _placement("old", 0))])  # type: ignore[arg-type]
    assert [instance for _, instance in kept] == ["instance2"] and retire == ["instance0", "instance1"]
    # Other settings (a priority), or another device, are other instances.
    other = _cpu_group("old", 1, priority=2)
    gpu = ModelInstanceGroup(name="old", kind=ModelInstanceGroup.KIND_GPU, count=1)
    wanted = [(other, _placement("old", 0)), (gpu, _placement("old", 0, InstanceKind.GPU, 1))]
    kept, create, retire = plan_instance_changes(placed, wanted)  # type: ignore[arg-type]
    assert kept == [] and create == wanted and retire == ["instance0", "instance1", "instance2"]
