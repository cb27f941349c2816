"""The dynamic batcher (`dynamic_batching { … }`): many small requests, few large executions.

Requests queue per priority level, as in Triton's priority queue: level 1 first, and in each
level by arrival, then the level's requests whose timeout moved them behind (below). A batch
starts from the first request in that order and takes the requests that follow, across levels,
while their inputs fit together (same names and non-batch shapes) and the batch stays within
max_batch_size. As in Triton, it is sent at once at the largest preferred batch size it reaches
(up to the request that would take it past every preferred size), or whole when it cannot grow
or is as large as every preferred size; otherwise the batcher waits up to
max_queue_delay_microseconds (counted from the oldest request it holds) for more requests.

Queue policies apply per level: `max_queue_size` rejects requests when the level is full, and
a timeout either rejects a request that waited too long or, with `timeout_action: DELAY`,
moves it behind the requests of its level that have not timed out. Levels take room only while
requests wait in them: `priority_levels` may be as large as its type allows, as in Triton.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from coreserve.backend.api import ModelInstance
from coreserve.config.signature import ModelSignature
from coreserve.errors import InvalidArgumentError, UnavailableError, with_request_id
from coreserve.protos.model_config_pb2 import ModelDynamicBatching, ModelQueuePolicy
from coreserve.scheduling._ordering import OrderedRelease, insert_by_age
from coreserve.scheduling._scheduler import Scheduler
from coreserve.scheduling.statistics import ModelStatistics
from coreserve.types import InferenceRequest, now_ns

ShapeKey = tuple[tuple[str, tuple[int, ...]], ...]
# A queue of the batcher: (priority level, 0) holds the level's requests, (level, 1) those whose
# timeout delayed them (timeout_action DELAY).
QueueKey = tuple[int, int]


@dataclass(frozen=True)
class QueuePolicy:
    max_queue_size: int
    timeout_us: int
    delay_on_timeout: bool
    allow_override: bool

    @classmethod
    def from_config(cls, policy: ModelQueuePolicy) -> QueuePolicy:
        return cls(
            max_queue_size=policy.max_queue_size,
            timeout_us=policy.default_timeout_microseconds,
            delay_on_timeout=policy.timeout_action == ModelQueuePolicy.DELAY,
            allow_override=policy.allow_timeout_override,
        )

    def timeout_for(self, request: InferenceRequest) -> int:
        """The request's timeout in microseconds (0: none); an override may only shorten it, and
        (as Triton's PriorityQueue reads it) a level without a timeout keeps none."""
        requested = request.parameters.get("timeout", 0)
        if self.allow_override and type(requested) is int and 0 < requested < self.timeout_us:
            return requested
        return self.timeout_us


def shape_key(request: InferenceRequest, ragged: frozenset[str] = frozenset()) -> ShapeKey:
    """What must be equal for two requests to share a batch: input names and non-batch shapes
    (of a `ragged` input only the name: the model takes the batch's elements flat)."""
    return tuple(
        sorted((name, () if name in ragged else array.shape[1:]) for name, array in request.inputs.items())
    )


class DynamicBatcher(Scheduler):
    """Forms batches from queued requests as Triton's dynamic batcher does."""

    # A batch forms from what queues while the instances are busy: none is taken ahead.
    pipelines = False

    def __init__(
        self,
        signature: ModelSignature,
        statistics: ModelStatistics,
        instances: Sequence[ModelInstance],
        batching: ModelDynamicBatching,
        *,
        decoupled: bool = False,
    ) -> None:
        super().__init__(signature, statistics, instances, decoupled=decoupled)
        self._max_batch_size = signature.max_batch_size
        self._preferred = frozenset(batching.preferred_batch_size)
        self._delay_ns = batching.max_queue_delay_microseconds * 1000
        self._levels = max(1, batching.priority_levels)
        self._default_level = batching.default_priority_level or self._levels
        by_level = batching.priority_queue_policy if batching.priority_levels else {}  # (as Triton)
        self._policies = {level: QueuePolicy.from_config(policy) for level, policy in by_level.items()}
        self._default_policy = QueuePolicy.from_config(batching.default_queue_policy)
        self._queues: dict[QueueKey, deque[InferenceRequest]] = {}  # none empty
        self._timers: dict[int, asyncio.TimerHandle] = {}
        self._forming = asyncio.Lock()
        self._arrived = asyncio.Event()
        self._ordered = OrderedRelease() if batching.preserve_ordering else None

    @property
    def queue_size(self) -> int:
        return sum(len(queue) for queue in self._queues.values())

    def _policy(self, level: int) -> QueuePolicy:
        return self._policies.get(level, self._default_policy)

    def _level_queue(self, key: QueueKey) -> deque[InferenceRequest]:
        """The queue `key` names, made when it holds no request (see `_prune`)."""
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = deque()
        return queue

    def _prune(self, key: QueueKey) -> None:
        if not self._queues.get(key, True):
            del self._queues[key]

    def _in_order(self) -> Iterator[InferenceRequest]:
        """Every queued request, in the order batches take them."""
        for key in sorted(self._queues):
            yield from self._queues[key]

    def _level_of(self, request: InferenceRequest) -> int:
        priority = request.parameters.get("priority", 0)
        if not isinstance(priority, int) or isinstance(priority, bool) or priority < 0:
            raise InvalidArgumentError(
                f"request parameter 'priority' must be a non-negative integer, got {priority!r}"
            )
        # As Triton (InferenceRequest::SetPriority): 0 and levels beyond the model's get its default.
        if priority == 0 or priority > self._levels:
            return self._default_level
        return priority

    def _enqueue(self, request: InferenceRequest) -> None:
        level = self._level_of(request)
        policy = self._policy(level)
        waiting = len(self._queues.get((level, 0), ())) + len(self._queues.get((level, 1), ()))
        if (
            policy.max_queue_size and waiting >= policy.max_queue_size
        ):  # (its delayed ones count, as Triton's)
            # Triton's words first (core's PriorityQueue), then which queue. Not counted as a
            # failure: as on Triton, the request never got into the model.
            raise UnavailableError(
                with_request_id(request.id, "Exceeds maximum queue size")
                + f": model '{self.signature.model_name}': the queue of priority level {level} is full "
                f"(max_queue_size {policy.max_queue_size}); try again later"
            )
        self._time(request, level, policy.timeout_for(request) / 1e6)
        self._level_queue((level, 0)).append(request)
        self._arrived.set()

    def _time(self, request: InferenceRequest, level: int, timeout_s: float) -> None:
        """Arms the queue policy's timeout of a request (0: none)."""
        if timeout_s:
            policy = self._policy(level)
            self._timers[id(request)] = asyncio.get_running_loop().call_later(
                timeout_s, self._expire, request, level, policy.delay_on_timeout
            )

    def _enqueue_by_age(self, request: InferenceRequest) -> None:
        """Back into its level's queue by age; its timeout counts from when it first queued."""
        level = self._level_of(request)  # (it was checked when it first queued)
        timeout_us = self._policy(level).timeout_for(request)
        if timeout_us:
            waited_s = (now_ns() - request.queued_ns) / 1e9
            self._time(request, level, max(timeout_us / 1e6 - waited_s, 1e-6))
        insert_by_age(self._level_queue((level, 0)), request)
        self._arrived.set()

    def _expire(self, request: InferenceRequest, level: int, delay: bool) -> None:
        self._timers.pop(id(request), None)
        try:
            self._queues.get((level, 0), deque()).remove(request)
        except ValueError:
            return  # already on its way to an instance
        self._prune((level, 0))
        if delay:
            self._level_queue((level, 1)).append(request)
            self._arrived.set()  # the batch being formed now takes it later, maybe at once
            return
        self.statistics.record_failure(request, "REJECTED")
        if request.sink is not None:
            request.sink.fail(
                UnavailableError(  # Triton's words, then which queue
                    f"Request timeout expired: the request waited in model '{self.signature.model_name}''s "
                    f"queue of priority level {level} past its timeout"
                )
            )
        self._arrived.set()  # the batch being formed may have lost its head

    def _remove_queued(self, request: InferenceRequest) -> bool:
        for key, queue in self._queues.items():
            try:
                queue.remove(request)
            except ValueError:
                continue
            self._prune(key)
            timer = self._timers.pop(id(request), None)
            if timer is not None:
                timer.cancel()
            self._arrived.set()  # the batch being formed may have lost its head
            return True
        return False

    def _candidate(self) -> tuple[int, list[int], bool]:
        """The batch that the first request in the queues' order starts.

        Returns when the oldest request it holds queued (0: no request queues), the batch sizes
        of its first 1, 2, … requests, and whether it is complete: it cannot grow
        (max_batch_size reached, or the next request does not fit).
        """
        ragged = self.signature.ragged_inputs
        key: ShapeKey = ()
        sizes: list[int] = []
        size = 0
        oldest_ns = 0
        for request in self._in_order():
            if not sizes:
                key = shape_key(request, ragged)
            elif shape_key(request, ragged) != key or size + request.batch_size > self._max_batch_size:
                return oldest_ns, sizes, True
            oldest_ns = min(oldest_ns or request.queued_ns, request.queued_ns)
            size += request.batch_size
            sizes.append(size)
            if size >= self._max_batch_size:
                return oldest_ns, sizes, True
        return oldest_ns, sizes, False

    async def _take_batch(self, index: int) -> list[InferenceRequest]:
        async with self._forming:
            while True:
                oldest_ns, sizes, complete = self._candidate()
                if not sizes:
                    return []
                waited_ns = now_ns() - oldest_ns
                count = len(sizes) if self._closed else self._count_to_send(sizes, complete, waited_ns)
                if count:
                    return self._pop(count)
                self._arrived.clear()
                remaining = (oldest_ns + self._delay_ns - now_ns()) / 1e9
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._arrived.wait(), max(remaining, 0.0))

    def _count_to_send(self, sizes: list[int], complete: bool, waited_ns: int) -> int:
        """How many of the candidate's requests go now (0: it waits), as Triton's dynamic batcher
        decides (GetDynamicBatch). `sizes`, `complete`: as `_candidate` returns them; `waited_ns`:
        how long its oldest request has queued.

        The batch goes at the largest preferred size it reaches before a request would take it
        past every preferred size, or else up to that request; a batch that cannot grow or is at
        least as large as every preferred size goes whole; otherwise it waits out the delay.
        """
        largest = max(self._preferred, default=self._max_batch_size)
        best = 0
        for count, size in enumerate(sizes, start=1):
            if count > 1 and size > largest and not best:
                best = count - 1
            if size in self._preferred:
                best = count
        delay_over = self._delay_ns != 0 and waited_ns >= self._delay_ns
        if best and not delay_over:
            return best
        if complete or delay_over or self._delay_ns == 0 or sizes[-1] >= largest:
            return len(sizes)
        return 0

    def _send_what_waits(self) -> None:
        self._arrived.set()  # the batch being formed stops waiting: it is sent as it is

    def _pop(self, count: int) -> list[InferenceRequest]:
        """The first `count` requests in the queues' order, taken out."""
        batch: list[InferenceRequest] = []
        for key in sorted(self._queues):
            queue = self._queues[key]
            while queue and len(batch) < count:
                batch.append(queue.popleft())
            self._prune(key)
            if len(batch) == count:
                break
        for request in batch:
            timer = self._timers.pop(id(request), None)
            if timer is not None:
                timer.cancel()
        return batch

    def _drain(self) -> Iterable[InferenceRequest]:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        while self._queues:
            key = min(self._queues)
            queue = self._queues[key]
            while queue:
                yield queue.popleft()  # (a request failed meanwhile may have emptied and pruned it)
            self._queues.pop(key, None)
