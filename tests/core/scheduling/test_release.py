"""What a scheduler lets go of: finished requests while it runs, its instances once it is closed.

With the garbage collector off, so that only reference counting frees things: an instance kept
alive by a reference cycle stays alive (a framework's model, its memory and its threads) until the
collector happens to run, which is what an unloaded model must not wait for.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator, Sequence

import pytest

from coreserve.backend.responder import Responder
from coreserve.scheduling._dynamic import DynamicBatcher
from coreserve.scheduling._scheduler import Scheduler
from coreserve.types import InferenceRequest
from support.scheduling_doubles import (
    make_request,
    model_config,
    recording_sink,
    run_scenario,
    settle,
    signature_and_statistics,
)

CONFIG = (
    'name: "m" max_batch_size: 8 input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ] '
    'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]'
)


class EchoInstance:
    """An instance that echoes IN to OUT and keeps nothing of what it executed."""

    async def execute(self, requests: Sequence[InferenceRequest], responder: Responder) -> None:
        for request in requests:
            responder.send(request, {"OUT": request.inputs["IN"].copy()})

    async def close(self) -> None:
        pass


@pytest.fixture
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _scheduler(kind: str, instance: EchoInstance) -> Scheduler:
    if kind == "default":
        config = model_config(CONFIG)
        return Scheduler(*signature_and_statistics(config), [instance])
    config = model_config(CONFIG + " dynamic_batching { }")
    return DynamicBatcher(*signature_and_statistics(config), [instance], config.dynamic_batching)


@pytest.mark.parametrize("kind", ["default", "dynamic"])
def test_a_closed_scheduler_frees_its_instances_without_the_collector(collector_off: None, kind: str) -> None:
    refs: list[weakref.ref[EchoInstance]] = []

    async def scenario() -> None:
        instance = EchoInstance()
        refs.append(weakref.ref(instance))
        scheduler = _scheduler(kind, instance)
        scheduler.start()
        log: list[tuple[str, str]] = []
        for index in range(3):
            scheduler.submit(make_request(f"r{index}", log))
            await settle()
        assert log == [("r0", "final"), ("r1", "final"), ("r2", "final")]
        await scheduler.close(timeout=30)
        del scheduler, instance

    run_scenario(scenario)
    freed = refs[0]
    assert freed() is None, f"the closed scheduler's instance is still referenced by {_referrers(freed)}"


@pytest.mark.parametrize("kind", ["default", "dynamic"])
def test_an_idle_worker_holds_no_finished_request(collector_off: None, kind: str) -> None:
    async def scenario() -> None:
        scheduler = _scheduler(kind, EchoInstance())
        scheduler.start()
        log: list[tuple[str, str]] = []
        request = make_request("r0", log)
        sink = recording_sink(request)
        freed = weakref.ref(request.inputs["IN"])  # (a request takes no weak references)
        scheduler.submit(request)
        del request
        await settle()
        assert sink.done
        # Its tensors (a large input, say) must not wait in a worker's frame for the next request.
        assert freed() is None, f"the answered request's input is still referenced by {_referrers(freed)}"
        await scheduler.close(timeout=30)

    run_scenario(scenario)


def _referrers(ref: weakref.ref[object]) -> list[str]:
    target = ref()
    return [type(referrer).__name__ for referrer in gc.get_referrers(target)] if target is not None else []
