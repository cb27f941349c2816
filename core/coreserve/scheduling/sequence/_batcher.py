"""The sequence batcher (`sequence_batching { … }`) for stateful models.

Requests carry `sequence_id`, `sequence_start` and `sequence_end`. A sequence holds a slot
from its first request to its last; the requests of one sequence run one at a time and in
order, while requests of different sequences are batched together. A sequence stays on one
instance from start to end, as in Triton, so that a model's per-instance state follows it:
the instance with the most free slots when it starts. With the `direct` strategy (the
default) each batch holds at most one request per slot; with `oldest` an instance batches
the oldest waiting of its sequences. The batcher fills in control inputs (START, END, READY,
CORRID) and feeds each sequence's implicit state from one request to the next.

Slots: each instance has max(1, max_batch_size) of them (`oldest`: max_candidate_sequences,
if set). A batch runs as soon as one request is ready, unless the strategy asks to wait for
more, up to max_queue_delay_microseconds from the oldest ready request: `direct` while fewer
than minimum_slot_utilization of an instance's slots are ready, `oldest` until the batch
reaches max_batch_size or a preferred_batch_size; `oldest.preserve_ordering` holds each
batch's responses until every earlier batch has sent its own. A sequence that starts while
every slot is busy waits for one; if none frees within max_sequence_idle_microseconds, its
requests fail with UNAVAILABLE. A sequence that sends nothing for that long is released, and
its later requests get an error saying so.

Cancellation (as Triton's): a cancelled request leaves without executing, and so does every
request its sequence still has waiting; the sequence is released (its next request must start
it again). Iterative sequences (`iterative_sequence: true`): a request without a sequence id
is a sequence of its own, and a request the model hands back (`Responder.reschedule`, pb_utils'
RESCHEDULE release) runs again in its slot, before the sequence's later requests, with START
off; the sequence of such a request ends when the request is finally answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from coreserve.backend.api import ModelInstance
from coreserve.config import SEQUENCE_IDLE_DEFAULT_US
from coreserve.config.signature import ModelSignature
from coreserve.errors import (
    CancelledError,
    CoreserveError,
    InternalError,
    InvalidArgumentError,
    UnavailableError,
)
from coreserve.protos.model_config_pb2 import ModelSequenceBatching
from coreserve.scheduling._ordering import OrderedRelease
from coreserve.scheduling._scheduler import STOPPING_TEXT
from coreserve.scheduling.sequence._pools import SlotPools
from coreserve.scheduling.sequence._slot import SequenceSlot, StateCapture, Step
from coreserve.scheduling.sequence._tensors import (
    SequenceId,
    control_tensors,
    sequence_flags,
    state_tensors,
)
from coreserve.scheduling.statistics import ModelStatistics
from coreserve.types import InferenceRequest, now_ns

logger = logging.getLogger(__name__)
_REMEMBERED_RELEASES = 1024
CANCELLED_REASON = "a request of it was cancelled"


class SequenceBatcher(SlotPools):
    """Routes the requests of each sequence to its slot and batches across sequences.

    It runs on the scheduler's worker loop: one worker per instance takes the batch of that
    instance's ready sequences (`_take_batch`) and, once it has run, moves each sequence on
    (`_batch_done`).
    """

    # A stateful sequence must run every request: a cached answer would skip its state.
    answers_from_cache = False

    def __init__(
        self,
        signature: ModelSignature,
        statistics: ModelStatistics,
        instances: Sequence[ModelInstance],
        batching: ModelSequenceBatching,
        model_path: Path | None,
        *,
        decoupled: bool = False,
    ) -> None:
        # Each instance has its own slots (Triton gives each instance its own batcher).
        per_batch = max(1, signature.max_batch_size)
        direct = batching.WhichOneof("strategy_choice") != "oldest"
        slots = per_batch if direct else batching.oldest.max_candidate_sequences or per_batch
        super().__init__(signature, statistics, instances, slots, decoupled=decoupled)
        self._controls = control_tensors(batching)
        self._states = state_tensors(batching, signature.model_name, model_path)
        self._direct = direct
        self._per_batch = per_batch
        self._delay_ns, self._enough = self._batch_policy(batching)
        if not self._direct and batching.oldest.preserve_ordering:
            self._ordered = OrderedRelease()
        self._idle_ns = (batching.max_sequence_idle_microseconds or SEQUENCE_IDLE_DEFAULT_US) * 1000
        self._released: OrderedDict[SequenceId, str] = OrderedDict()
        # What each instance's worker took (its one batch at a time), until it has run.
        self._taken: dict[int, list[tuple[SequenceSlot, Step]]] = {}
        self._iterative = batching.iterative_sequence
        self._auto_ids = itertools.count(1)
        self._returned: set[int] = set()  # ids of requests the model handed back, this batch

    def _batch_policy(self, batching: ModelSequenceBatching) -> tuple[int, frozenset[int]]:
        """How long a batch may wait for more ready sequences, and the sizes that end the wait."""
        if self._direct:
            delay_us = batching.direct.max_queue_delay_microseconds
            minimum = math.ceil(batching.direct.minimum_slot_utilization * self._per_batch - 1e-9)
            enough: Iterable[int] = range(max(1, minimum), self._per_batch + 1)
        else:
            delay_us = batching.oldest.max_queue_delay_microseconds
            enough = [*batching.oldest.preferred_batch_size, self._per_batch]
        return delay_us * 1000, frozenset(enough)

    @property
    def queue_size(self) -> int:
        return sum(len(sequence.steps) for sequence in self._sequences.values())

    def start(self) -> None:
        super().start()
        # Closing cancels it with the workers.
        self._tasks.append(asyncio.create_task(self._sweep(), name=f"{self.signature.model_name}:sequences"))

    def _workers_for(self, instance: ModelInstance) -> int:
        return 1  # each instance runs one batch at a time: its sequences' requests in order

    def _stop_refuses(self, request: InferenceRequest) -> str | None:
        """While the server stops, only a new sequence is refused (Triton's words, without the
        request's id): the sequences under way get their remaining requests and end."""
        return STOPPING_TEXT if request.parameters.get("sequence_start") else None

    def _enqueue(self, request: InferenceRequest) -> None:
        """Queues a request behind the earlier ones of its sequence (which it may start)."""
        model = self.signature.model_name
        auto = self._iterative and request.parameters.get("sequence_id", 0) in (0, "")
        sequence_id, start, end = (self._auto_id(), True, False) if auto else sequence_flags(request, model)
        if self.signature.batching and request.batch_size != 1:
            raise InvalidArgumentError(
                f"inference request to model '{model}' must specify batch-size 1 due to requirements "
                f"of sequence batcher (got {request.batch_size})"
            )
        sequence = self._sequences.get(sequence_id)
        if not start and (sequence is None or sequence.ended):  # Triton's words, and why where known
            released = self._released.get(sequence_id) if sequence is None else None
            reason = f" (it was released: {released})" if released else ""
            raise InvalidArgumentError(
                f"inference request for sequence {sequence_id} to model '{model}' must specify the START "
                f"flag on the first request of the sequence{reason or (' (it ended)' if sequence else '')}"
            )
        if sequence is None:
            sequence = SequenceSlot(sequence_id, waiting_since_ns=now_ns(), auto=auto)
            self._sequences[sequence_id] = sequence
            self._released.pop(sequence_id, None)
            self._take_slot(sequence)
        elif start and not sequence.ended:
            logger.warning(
                "sequence %s for model '%s' has a conflict. The previous sequence did not end before this "
                "sequence start. Previous sequence will be terminated early.",
                sequence_id,
                model,
            )
        sequence.active_ns = request.queued_ns
        sequence.steps.append(Step(request, start, end))
        sequence.ended = end
        sequence.cancelled = sequence.cancelled and not start
        self._notify(sequence)

    def _auto_id(self) -> int:
        """A sequence id for a request of an iterative sequence that has none (Triton counts
        from 1), skipping ids that clients' sequences hold now."""
        while True:
            sequence_id = next(self._auto_ids)
            if sequence_id not in self._sequences:
                return sequence_id

    def withdraw(self, request: InferenceRequest) -> None:
        """Fails a cancelled request that waits here, and every request its sequence still has
        waiting; releases the sequence (at once, or when the request it runs returns). A
        running request runs on (its backend sees is_cancelled()), but its sequence's waiting
        requests fail all the same, as on Triton."""
        sequence = next(
            (
                sequence
                for sequence in self._sequences.values()
                if sequence.running is request or any(step.request is request for step in sequence.steps)
            ),
            None,
        )
        if sequence is None:
            return  # answered already
        self._cancel_sequence(sequence)

    def _cancel_sequence(self, sequence: SequenceSlot) -> None:
        model = self.signature.model_name
        self._notify(sequence)  # a worker waiting for its batch to fill looks again (and may idle)
        steps, sequence.steps = list(sequence.steps), deque()
        for step in steps:
            self.statistics.record_failure(step.request, "CANCELED")
            if step.request.sink is not None:
                step.request.sink.fail(CancelledError(f"request for model '{model}' was cancelled"))
        if not sequence.busy:
            self._release(sequence, CANCELLED_REASON)
        else:
            sequence.ended = sequence.cancelled = True
        self._note_if_idle()

    def _take_back(self, requests: Sequence[InferenceRequest]) -> None:
        if not self._iterative:
            super()._take_back(requests)
            return
        self._returned.update(id(request) for request in requests)

    def _requeue(self, requests: Sequence[tuple[InferenceRequest, CoreserveError]]) -> None:
        """Fails requests an instance handed back unstarted, with the instance's error: a
        sequence stays on its instance, and its state there died with the worker process."""
        for request, error in requests:
            self.statistics.record_failure(request, "BACKEND")
            if request.sink is not None:
                request.sink.fail(error)

    def _release(self, sequence: SequenceSlot, reason: str) -> None:
        if self._sequences.get(sequence.id) is sequence:
            del self._sequences[sequence.id]
        with contextlib.suppress(ValueError):
            self._backlog.remove(sequence)
        self._released[sequence.id] = reason
        while len(self._released) > _REMEMBERED_RELEASES:
            self._released.popitem(last=False)
        if sequence.slotted:
            self._free_slot(sequence)

    def _ready_sequences(self, index: int) -> list[SequenceSlot]:
        """The sequences instance `index` may run now, the longest waiting first."""
        candidates = [
            sequence
            for sequence in self._sequences.values()
            if sequence.slotted and not sequence.busy and sequence.steps and sequence.instance == index
        ]
        candidates.sort(key=lambda sequence: sequence.steps[0].request.queued_ns)
        return candidates[: self._per_batch]

    def _wait_ns(self, candidates: Sequence[SequenceSlot]) -> int:
        """How much longer the batch of `candidates` should wait for more (0: run it now)."""
        if not self._delay_ns or len(candidates) in self._enough or self._closed:
            return 0
        return max(0, candidates[0].steps[0].request.queued_ns + self._delay_ns - now_ns())

    def _take(self, candidates: Sequence[SequenceSlot]) -> list[tuple[SequenceSlot, Step]]:
        taken = []
        for sequence in candidates:
            sequence.busy = True
            step = sequence.steps.popleft()
            sequence.running = step.request
            taken.append((sequence, step))
        return taken

    def _prepare(self, sequence: SequenceSlot, step: Step) -> InferenceRequest:
        request = step.request
        batching = self.signature.batching
        for control in self._controls:
            request.inputs[control.name] = control.value(sequence.id, step.start, step.end, batching)
        if sequence.auto or step.again:
            # What the backend reads as the request's correlation id and flags (Triton's): the
            # id the batcher gave, START on the first execution only.
            request.parameters["sequence_id"] = sequence.id
            request.parameters["sequence_start"] = step.start
        if step.again:
            return request  # its state outputs are asked for and captured since its first run
        if step.start:
            sequence.state.clear()
        for state in self._states:
            value = sequence.state.get(state.input_name)
            if value is None:
                value = state.initial[np.newaxis] if batching else state.initial
            request.inputs[state.input_name] = value
        if self._states:
            if request.requested_outputs is not None:
                request.requested_outputs += tuple(state.output_name for state in self._states)
            assert request.sink is not None
            request.sink = StateCapture(request.sink, sequence, self._states)
        return request

    def _has_work(self, index: int) -> bool:
        return bool(self._ready_sequences(index))

    async def _wait_for_work(self, index: int) -> None:
        ready = self._ready[index]
        ready.clear()
        await ready.wait()

    async def _take_batch(self, index: int) -> list[InferenceRequest]:
        """A request of each ready sequence of instance `index`, prepared; none while the
        batch should wait for more ready sequences (the worker then looks again)."""
        candidates = self._ready_sequences(index)
        wait_ns = self._wait_ns(candidates)
        if wait_ns:
            ready = self._ready[index]
            ready.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ready.wait(), wait_ns / 1e9)
            return []
        taken = self._taken[index] = self._take(candidates)
        batch = []
        for sequence, step in taken:
            try:
                batch.append(self._prepare(sequence, step))
            except Exception as exc:  # this request fails; the instance's worker goes on
                if not isinstance(exc, CoreserveError):
                    logger.exception(
                        "model '%s': preparing a sequence's request failed", self.signature.model_name
                    )
                    exc = InternalError(f"preparing the request of sequence {sequence.id} failed: {exc}")
                if step.request.sink is not None:
                    step.request.sink.fail(exc)
        return batch

    def _batch_done(self, index: int) -> None:
        for sequence, step in self._taken.pop(index, ()):
            sequence.busy = False
            sequence.running = None
            sequence.active_ns = now_ns()
            self._after_step(sequence, step)

    def _after_step(self, sequence: SequenceSlot, step: Step) -> None:
        """Puts a handed-back request first in line again, and releases a sequence that ended."""
        request = step.request
        if id(request) in self._returned:
            self._returned.discard(id(request))
            if request.is_cancelled() or self._sequences.get(sequence.id) is not sequence:
                self.statistics.record_failure(request, "CANCELED")
                if request.sink is not None:
                    request.sink.fail(
                        CancelledError(f"request for model '{request.model_name}' was cancelled")
                    )
                self._cancel_sequence(sequence)
                return
            request.queued_ns = now_ns()
            sequence.steps.appendleft(Step(request, False, step.end, again=True))
            self._notify(sequence)
            return
        if self._sequences.get(sequence.id) is not sequence:
            return  # released meanwhile (cancelled, or idle)
        if (step.end or sequence.auto or sequence.ended) and not sequence.steps:
            ran = "its last request ran" if sequence.auto else "its last request (sequence_end) ran"
            self._release(sequence, CANCELLED_REASON if sequence.cancelled else ran)
        else:
            self._notify(sequence)

    async def _sweep(self) -> None:
        """Releases idle sequences and gives up on sequences that waited too long for a slot."""
        interval = max(self._idle_ns / 4e9, 0.01)
        while True:
            await asyncio.sleep(interval)
            now = now_ns()
            for sequence in list(self._sequences.values()):
                if sequence.busy or sequence.steps or now - sequence.active_ns < self._idle_ns:
                    continue
                self._release(sequence, f"idle for more than {self._idle_ns // 1000} microseconds")
            for sequence in list(self._backlog):
                if now - sequence.waiting_since_ns < self._idle_ns:
                    continue
                self._backlog.remove(sequence)
                if self._sequences.get(sequence.id) is sequence:
                    del self._sequences[sequence.id]
                error = UnavailableError(
                    f"all {self._capacity} sequence slots of model '{self.signature.model_name}' stayed busy "
                    f"for {self._idle_ns // 1000} microseconds; sequence {sequence.id!r} could not start"
                )
                for step in sequence.steps:
                    self.statistics.record_failure(step.request, "REJECTED")
                    if step.request.sink is not None:
                        step.request.sink.fail(error)
                sequence.steps.clear()
            self._note_if_idle()

    def _drain(self) -> Iterable[InferenceRequest]:
        for sequence in self._sequences.values():
            while sequence.steps:
                yield sequence.steps.popleft().request
