"""Shadow copies: a share of a model's requests also sent to a candidate version, its answers
compared with the client's and dropped.

A copy never holds the client's request: it is a request of its own (no deadline, no cancellation from the
client), it is sent once the client's answer is ready (its inputs, and the outputs it is compared
with, copied then: an in-process caller may change the arrays it got), it queues in the
candidate's scheduler, and while the shadow's `max_in_flight` copies of a model wait or run,
further ones are shed and counted. Each output of both answers is compared: numbers by
their largest absolute difference, BYTES (and outputs whose shape or type differ) by whether
they match.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from coreserve.errors import CoreserveError, InternalError
from coreserve.repository.traffic.policy import Shadow
from coreserve.responses import ForwardingSink, SingleResponse
from coreserve.types import InferenceRequest, InferenceResponse, ResponseSink

logger = logging.getLogger(__name__)
Submit = Callable[[InferenceRequest, ResponseSink], None]


@dataclass
class OutputComparison:
    """What the comparisons of one output of one candidate found."""

    compared: int = 0
    mismatched: int = 0
    max_abs_diff: float = 0.0


@dataclass
class ShadowCounts:
    """The copies of one model sent to one candidate version, by outcome, and their outputs."""

    compared: int = 0
    shed: int = 0
    failed: int = 0
    outputs: dict[str, OutputComparison] = field(default_factory=lambda: defaultdict(OutputComparison))


class ShadowCopies:
    """The shadow copies of every model: sent, bounded, compared, counted."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, int], ShadowCounts] = defaultdict(ShadowCounts)
        self._in_flight: dict[str, int] = defaultdict(int)

    def watch(
        self, sink: ResponseSink, shadow: Shadow, request: InferenceRequest, submit: Submit
    ) -> ResponseSink:
        """The sink of `request`, whose model answers each request once: one that copies the
        request to the shadow's version when it is answered, if the request is in the shadow's
        share, else `sink`. Requests of a sequence are not copied (a copy of some of a sequence's
        steps would break the candidate's sequence), nor those that fail (there is nothing to
        compare)."""
        if shadow.share < 100 and random.random() * 100 >= shadow.share:
            return sink
        if any(key.startswith("sequence_") for key in request.parameters):
            return sink
        return _CopyingSink(sink, self, shadow, request, submit)

    def take(self, shadow: Shadow, request: InferenceRequest) -> InferenceRequest | None:
        """The copy of `request` for the shadow's version, its inputs copied now: an input read
        from a shared memory region (or an in-process caller's array) may change once the client
        has its answer. None where the shadow's copies in flight are as many as it takes (shed)."""
        name = request.model_name
        if self._in_flight[name] >= shadow.max_in_flight:
            self.counts[name, shadow.version].shed += 1
            return None
        self._in_flight[name] += 1
        return InferenceRequest(
            model_name=name,
            inputs={key: np.copy(array) for key, array in request.inputs.items()},
            model_version=str(shadow.version),
            id=request.id,
            parameters={key: value for key, value in request.parameters.items() if key != "timeout"},
            requested_outputs=request.requested_outputs,
            class_counts=request.class_counts,
        )

    def send(self, copy: InferenceRequest, expected: dict[str, np.ndarray], submit: Submit) -> None:
        """Sends a copy `take` made; its answer is compared with the client's outputs, `expected`."""
        name = copy.model_name
        counts = self.counts[name, int(copy.model_version)]
        sink = SingleResponse(asyncio.get_running_loop())

        def done(_: object) -> None:
            self._in_flight[name] -= 1
            if sink.future.exception() is not None:
                counts.failed += 1
            else:
                counts.compared += 1
                _compare(expected, sink.future.result(), counts)

        sink.future.add_done_callback(done)
        try:
            submit(copy, sink)
        except CoreserveError as exc:  # refused outright (unloaded meanwhile, a shape it does not take)
            logger.debug("shadow copy of a request for model '%s' refused: %s", name, exc.message)
            sink.fail(exc)
        except Exception as exc:  # a fault of the server's: logged, the copy counted as failed
            logger.exception("shadow copy of a request for model '%s' could not be sent", name)
            sink.fail(InternalError(f"the shadow copy could not be sent: {exc}"))


class _CopyingSink(ForwardingSink):
    """The sink of a request in a shadow's share: the copy is taken before the client has its
    answer and sent after the client's task has had its turn."""

    __slots__ = ("_copies", "_request", "_shadow", "_submit")

    def __init__(
        self,
        sink: ResponseSink,
        copies: ShadowCopies,
        shadow: Shadow,
        request: InferenceRequest,
        submit: Submit,
    ) -> None:
        super().__init__(sink)
        self._copies = copies
        self._shadow = shadow
        self._request = request
        self._submit = submit

    def send(self, response: InferenceResponse | None, final: bool) -> None:
        if response is None or not final or self._target.done:
            self._target.send(response, final)
            return
        copy = self._copies.take(self._shadow, self._request)
        expected = {name: np.copy(a) for name, a in response.outputs.items()} if copy is not None else {}
        try:
            self._target.send(response, final)
        finally:  # a copy taken counts as in flight until answered: it goes whatever the client's sink did
            if copy is not None:
                asyncio.get_running_loop().call_soon(self._copies.send, copy, expected, self._submit)


def _compare(client: dict[str, np.ndarray], candidate: InferenceResponse, counts: ShadowCounts) -> None:
    for name, expected in client.items():
        found = candidate.outputs.get(name)
        output = counts.outputs[name]
        output.compared += 1
        if found is None or found.shape != expected.shape or found.dtype.kind != expected.dtype.kind:
            output.mismatched += 1
        elif expected.dtype.kind in "OSUb":  # BYTES, strings and booleans match or not
            output.mismatched += int(not np.array_equal(found, expected))
        elif expected.size:
            found, expected = found.ravel(), expected.ravel()  # (a 0-d output too)
            same = found == expected  # exact: equal infinities are equal
            if expected.dtype.kind not in "iu":  # (floats, and BF16 of kind "V")
                same |= np.isnan(found) & np.isnan(expected)
            output.mismatched += int(not same.all())
            output.max_abs_diff = max(output.max_abs_diff, _largest_gap(found[~same], expected[~same]))


def _largest_gap(found: np.ndarray, expected: np.ndarray) -> float:
    """The largest absolute difference between values that differ (in float64: inf where a NaN
    or an infinity is on one side only; integers past 2**53 that differ, by 1 at least)."""
    if not found.size:
        return 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        gaps = np.abs(found.astype(np.float64) - expected.astype(np.float64))
    largest = float(np.max(np.where(np.isnan(gaps), np.inf, gaps)))
    return max(largest, 1.0) if expected.dtype.kind in "iu" else largest
