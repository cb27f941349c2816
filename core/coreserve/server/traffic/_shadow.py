"""Shadow copies: a share of a model's requests also sent to a candidate version, its answers
compared with the client's and dropped.

A copy never slows the client: it has its own request (no deadline, no cancellation from the
client), it queues in the candidate's scheduler, and while `MAX_IN_FLIGHT` copies of a model
wait, further ones are shed and counted. Each output of both answers is compared: numbers by
their largest absolute difference, BYTES (and outputs whose shape or type differ) by whether
they match.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from coreserve.errors import CoreserveError
from coreserve.repository.traffic.policy import Shadow
from coreserve.responses import SingleResponse
from coreserve.types import InferenceRequest, InferenceResponse

logger = logging.getLogger(__name__)

# Copies of one model waiting or running at once; more are shed.
MAX_IN_FLIGHT = 64


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

    def copy(self, shadow: Shadow, request: InferenceRequest) -> InferenceRequest | None:
        """The copy of `request` for the candidate, if this request is in the shadow's share and
        the model has room for one more (None otherwise; a shed copy is counted)."""
        if shadow.share < 100 and random.random() * 100 >= shadow.share:
            return None
        name = request.model_name
        if self._in_flight[name] >= MAX_IN_FLIGHT:
            self.counts[name, shadow.version].shed += 1
            return None
        parameters = {key: value for key, value in request.parameters.items() if key != "timeout"}
        return InferenceRequest(
            model_name=name,
            inputs=request.inputs,
            model_version=str(shadow.version),
            id=request.id,
            parameters=parameters,
            requested_outputs=request.requested_outputs,
            class_counts=request.class_counts,
        )

    def watch(self, copy: InferenceRequest, answer: asyncio.Future[InferenceResponse]) -> SingleResponse:
        """The sink the copy is submitted with; compares its answer with the client's `answer`
        once both are there."""
        name, version = copy.model_name, int(copy.model_version)
        self._in_flight[name] += 1
        sink = SingleResponse(asyncio.get_running_loop())
        compared = False

        def both_done(_: object) -> None:
            nonlocal compared  # (both callbacks may find both futures done: count once)
            if compared or not (sink.future.done() and answer.done()):
                return
            compared = True
            self._in_flight[name] -= 1
            counts = self.counts[name, version]
            if sink.future.exception() is not None:
                counts.failed += 1
            elif answer.exception() is None and not answer.cancelled():
                counts.compared += 1
                _compare(answer.result(), sink.future.result(), counts)

        sink.future.add_done_callback(both_done)
        answer.add_done_callback(both_done)
        return sink

    def failed_to_submit(self, copy: InferenceRequest, error: CoreserveError) -> None:
        """A copy its candidate refused outright (unloaded meanwhile, a shape it does not take)."""
        self.counts[copy.model_name, int(copy.model_version)].failed += 1
        logger.debug("shadow copy of a request for model '%s' refused: %s", copy.model_name, error.message)


def _compare(client: InferenceResponse, candidate: InferenceResponse, counts: ShadowCounts) -> None:
    for name, expected in client.outputs.items():
        found = candidate.outputs.get(name)
        output = counts.outputs[name]
        output.compared += 1
        if found is None or found.shape != expected.shape or found.dtype.kind != expected.dtype.kind:
            output.mismatched += 1
        elif expected.dtype.kind in "OSUb":  # BYTES, strings and booleans match or not
            output.mismatched += int(not np.array_equal(found, expected))
        elif expected.size:
            difference = float(np.max(np.abs(found.astype(np.float64) - expected.astype(np.float64))))
            output.mismatched += int(difference != 0)
            output.max_abs_diff = max(output.max_abs_diff, difference)
