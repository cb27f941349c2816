"""Running one batch on one instance, with the guarantees the core gives every backend; closing
the instances of a version within a time."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from functools import partial

from coreserve.backend.api import ModelInstance
from coreserve.backend.responder import Responder
from coreserve.config.signature import ModelSignature
from coreserve.errors import CoreserveError, InternalError
from coreserve.responses import ForwardingSink
from coreserve.scheduling._stream_outcome import OpenStreams, StreamOutcome
from coreserve.scheduling.statistics import ExecutionTiming, ModelStatistics
from coreserve.types import InferenceRequest, InferenceResponse, ResponseSink, now_ns

logger = logging.getLogger(__name__)
# How long an instance whose close was cancelled gets to release what it holds (kill workers).
CANCELLED_CLOSE_GRACE_S = 10.0


async def execute_batch(
    instance: ModelInstance,
    batch: Sequence[InferenceRequest],
    signature: ModelSignature,
    statistics: ModelStatistics,
    *,
    decoupled: bool = False,
    streams: OpenStreams | None = None,
) -> Responder:
    """Executes a batch; whatever the backend does, every request of it ends answered.

    An exception from the backend fails the requests it left open; a non-decoupled backend
    that returns without answering a request fails that request with an internal error,
    unless it said it answers it later (`Responder.defer`). The execution is recorded in
    `statistics`; a request still open then (a decoupled one, or a deferred one) counts when
    it ends (see StreamOutcome), and is counted in `streams` until then. Requests the backend
    handed back (`Responder.reschedule`, `Responder.requeue`) stay open: the caller schedules
    them again or fails them.
    """
    model_version = statistics.version
    if decoupled:
        for request in batch:
            # Wrapped once: a rescheduled request comes back with its wrappers on.
            if request.sink is not None and not isinstance(request.sink, StreamOutcome):
                if statistics.first_response is not None:
                    request.sink = FirstResponseTimer(request, request.sink, statistics)
                request.sink = StreamOutcome(request, request.sink)
    for request in batch:
        if request.trace is not None:  # the compute marks are still to come
            request.trace.computing = True
    responder = Responder(signature, model_version, batch)
    try:
        await instance.execute(batch, responder)
    except CoreserveError as exc:
        responder.fail_open_requests(exc)
    except Exception as exc:
        logger.exception("model '%s' version %s failed while executing", signature.model_name, model_version)
        responder.fail_open_requests(
            InternalError(f"model '{signature.model_name}' failed: {type(exc).__name__}: {exc}")
        )
    else:
        if not decoupled:
            responder.fail_open_requests(
                InternalError(f"model '{signature.model_name}' returned without answering the request"),
                deferred=False,
            )
    if responder.withdrew_all:  # cancelled before the model got them: as if they left the queue
        for request in batch:
            statistics.record_failure(request, "CANCELED")
        return responder
    if responder.requeued_all:  # the instance never started them: no execution
        return responder
    end_ns = now_ns()
    timing = statistics.record_execution(batch, responder, end_ns)
    for request in batch:
        if not responder.is_open(request) or not (decoupled or responder.deferred(request)):
            continue
        if not decoupled and request.sink is not None:  # (a decoupled one's was wrapped above)
            request.sink = StreamOutcome(request, request.sink)
        if isinstance(request.sink, StreamOutcome):
            # Still answering (from the model's own thread): it counts once it ends.
            if streams is not None:
                streams.opened()
            request.sink.defer(partial(_settle, statistics, request, timing, streams))
    for request in batch:
        if request.trace is not None:  # the whole cost of tracing for a request not traced
            request.trace.executed(
                request.queued_ns,
                responder.compute_start_ns,
                responder.inputs_ready_ns,
                responder.infer_done_ns,
                end_ns,
                computed=not statistics.ensemble,
            )
    return responder


def _settle(
    statistics: ModelStatistics,
    request: InferenceRequest,
    timing: ExecutionTiming,
    streams: OpenStreams | None,
    reason: str | None,
) -> None:
    statistics.record_outcome(request, timing, reason)
    if streams is not None:
        streams.closed()


class FirstResponseTimer(ForwardingSink):
    """A request's sink that records when its first response leaves, for Triton's histogram."""

    __slots__ = ("_received_ns", "_statistics", "_timed")

    def __init__(self, request: InferenceRequest, target: ResponseSink, statistics: ModelStatistics) -> None:
        super().__init__(target)
        self._received_ns = request.received_ns
        self._statistics = statistics
        self._timed = False

    def send(self, response: InferenceResponse | None, final: bool) -> None:
        if response is not None and not self._timed:
            self._timed = True
            self._statistics.record_first_response(now_ns() - self._received_ns)
        self._target.send(response, final)


async def close_instances(instances: Sequence[ModelInstance], timeout: float | None, model_name: str) -> bool:
    """Closes instances side by side; cancels the closes still running after `timeout` s.
    Returns whether none had to be."""
    closes = [asyncio.create_task(instance.close()) for instance in instances]
    if not closes:
        return True
    await asyncio.sleep(0)  # every close has begun, so a cancellation reaches its cleanup
    _, late = await asyncio.wait(closes, timeout=timeout)
    if late:
        logger.warning(
            "model '%s': %d instances did not close within the exit timeout; cancelling them",
            model_name,
            len(late),
        )
        for task in late:
            task.cancel()
        await asyncio.wait(late, timeout=CANCELLED_CLOSE_GRACE_S)
    for task in closes:
        if task.done() and not task.cancelled() and task.exception() is not None:
            logger.error("model '%s': closing an instance failed", model_name, exc_info=task.exception())
    return not late
