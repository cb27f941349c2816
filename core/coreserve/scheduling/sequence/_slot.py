"""A sequence's place in the sequence batcher: its slot, its queued steps, its state."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from coreserve.responses import ForwardingSink
from coreserve.scheduling.sequence._tensors import SequenceId, StateTensor
from coreserve.types import InferenceRequest, InferenceResponse, ResponseSink


@dataclass(slots=True)
class Step:
    """A queued request of a sequence with its flags."""

    request: InferenceRequest
    start: bool
    end: bool
    again: bool = False  # handed back by the model (rescheduled): already prepared once


@dataclass(eq=False)
class SequenceSlot:
    """An active sequence: its waiting requests, its state and where it runs."""

    id: SequenceId
    steps: deque[Step] = field(default_factory=deque)
    state: dict[str, np.ndarray] = field(default_factory=dict)
    instance: int | None = None  # set when it gets a slot, for good
    slotted: bool = False
    busy: bool = False
    ended: bool = False
    auto: bool = False  # an iterative sequence the batcher opened for a request without an id
    cancelled: bool = False  # released once the request it runs returns
    running: InferenceRequest | None = None
    waiting_since_ns: int = 0
    active_ns: int = 0


class StateCapture(ForwardingSink):
    """Wraps a request's sink: takes the state outputs out of its response for the sequence."""

    __slots__ = ("_sequence", "_states")

    def __init__(self, target: ResponseSink, sequence: SequenceSlot, states: Sequence[StateTensor]) -> None:
        super().__init__(target)
        self._sequence = sequence
        self._states = states

    def send(self, response: InferenceResponse | None, final: bool) -> None:
        if response is not None:
            outputs = dict(response.outputs)
            for state in self._states:
                value = outputs.pop(state.output_name, None)
                if value is not None:
                    self._sequence.state[state.input_name] = value
            response.outputs = outputs
        self._target.send(response, final)
