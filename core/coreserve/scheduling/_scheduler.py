"""The instance pool of a model version and the default scheduler that feeds it.

Each instance has a worker task that takes the next batch from the scheduler's queue and
executes it, so an instance runs one batch at a time and requests run in parallel across
instances. The scheduler keeps the bookkeeping every kind shares: the workers, what is queued
and executing, idleness, and closing. Subclasses decide how requests queue, which instance may
take what, and how a batch is formed (hooks `_enqueue`, `_has_work`, `_wait_for_work`,
`_take_batch`, `_batch_done`); the default scheduler runs each request alone, in arrival order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Iterable, Sequence

from coreserve.backend.api import ModelInstance
from coreserve.backend.responder import Responder
from coreserve.config.signature import ModelSignature
from coreserve.errors import CancelledError, CoreserveError, InternalError, UnavailableError
from coreserve.scheduling._execution import close_instances, execute_batch
from coreserve.scheduling._instance_changes import InstanceChanges
from coreserve.scheduling._ordering import OrderedRelease, insert_by_age, unhold
from coreserve.scheduling._stream_outcome import OpenStreams
from coreserve.scheduling.cache.responses import ModelResponseCache
from coreserve.scheduling.rate_limiter import InstanceSlot, RateLimiter
from coreserve.scheduling.statistics import ModelStatistics
from coreserve.types import InferenceRequest, now_ns

logger = logging.getLogger(__name__)
# Triton 2.51's words when a model hands back a request that its scheduler cannot take back.
RESCHEDULE_REFUSED = (
    "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not "
    "configured to handle such a flag."
)

STOPPING_TEXT = "Server is stopping, scheduler for model has stopped accepting new inference requests"


def stop_refusal(request_id: str = "") -> str:
    """Triton's words refusing a client's request once the server stops."""
    return f"[request id: {request_id}] {STOPPING_TEXT}" if request_id else STOPPING_TEXT


class Scheduler(InstanceChanges):
    """Queues the requests of one model version and runs them on its instances."""

    # Whether the model's response cache (if any) may answer a request instead of an instance.
    answers_from_cache = True
    # Whether instances with a `pipeline_depth` get their next batches ahead of time: not where
    # a batch forms from what queues while the instances are busy (dynamic batching).
    pipelines = True

    def __init__(
        self,
        signature: ModelSignature,
        statistics: ModelStatistics,
        instances: Sequence[ModelInstance],
        *,
        decoupled: bool = False,
    ) -> None:
        self.signature = signature
        self.statistics = statistics
        self.model_version = statistics.version
        self.instances = list(instances)
        self.decoupled = decoupled
        self._queue: deque[InferenceRequest] = deque()
        # Idle workers, by the index of their instance (see _wake_worker).
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._awake = [0] * len(self.instances)  # each instance's workers not waiting for work
        self._pipelined = False  # some instance takes batches ahead (see _workers_for)
        # The instances' workers, and any task of a subclass that ends with them.
        self._tasks: list[asyncio.Task[None]] = []
        self._workers: dict[int, tuple[ModelInstance, list[asyncio.Task[None]]]] = {}  # by index
        # Workers taking or running a batch (`current_task()`: a local would make a cycle).
        self._in_batch: set[asyncio.Task[None]] = set()
        self._retired: set[int] = set()  # instances whose workers end after their batch
        self._busy = 0
        self._executing = 0
        self._idle = asyncio.Event()
        self._streams = OpenStreams()  # decoupled requests answering after their execution
        self._closed = False
        self._stopping = False  # the server stops: requests of clients are refused (see stopping)
        self._ordered: OrderedRelease | None = None  # set by schedulers that preserve ordering
        # In front of the queue when the model enables response_cache and the server has one.
        self.response_cache: ModelResponseCache | None = None
        # Under --rate-limit=execution_count: each instance's place in the server's limiter.
        self._rate_limiter: RateLimiter | None = None
        self._slots: dict[int, InstanceSlot] = {}

    def limit_rate(self, limiter: RateLimiter, slots: Sequence[InstanceSlot]) -> None:
        """Makes each instance wait for its turn at `limiter` (`slots`: one per instance, in order)."""
        self._rate_limiter = limiter
        self._slots = {id(instance): slot for instance, slot in zip(self.instances, slots, strict=True)}

    def serving(self) -> bool:
        """Whether an instance serves now: false while every instance restarts its worker
        process (read from the instances' optional `serving` event, see `ModelInstance`)."""
        if not self.instances:
            return True
        for instance in self.instances:
            serving = getattr(instance, "serving", None)
            if serving is None or serving.is_set():
                return True
        return False

    def failure(self) -> str:
        """Why an instance cannot serve now ("" while every one can), from the instances'
        optional `failure` attribute (see `ModelInstance`)."""
        for instance in self.instances:
            failure = getattr(instance, "failure", None)
            if failure:
                return str(failure)
        return ""

    @property
    def queue_size(self) -> int:
        return len(self._queue)

    @property
    def pending(self) -> int:
        """Requests that wait to execute: Triton's pending request count, which a request
        leaves as an instance begins executing it."""
        return self.queue_size + self._not_begun()

    @property
    def executing(self) -> int:
        return self._executing - self._not_begun()

    def _not_begun(self) -> int:
        """Requests taken off the queue that no instance has begun: waiting for the rate
        limiter, or handed ahead to an instance (its optional `unstarted_requests`)."""
        ahead = sum(getattr(instance, "unstarted_requests", 0) for instance in self.instances)
        return min(self._executing, sum(slot.waiting for slot in self._slots.values()) + ahead)

    @property
    def in_flight(self) -> int:
        return self.queue_size + self._executing  # pending or executing

    def start(self) -> None:
        self._idle.set()
        for index, instance in enumerate(self.instances):
            self._start_workers(index, instance)

    def _start_workers(self, index: int, instance: ModelInstance) -> None:
        workers: list[asyncio.Task[None]] = []
        self._workers[index] = (instance, workers)
        for slot in range(self._workers_for(instance)):
            self._awake[index] += 1
            name = f"{self.signature.model_name}:{self.model_version}:instance{index}:{slot}"
            workers.append(asyncio.create_task(self._work(index, instance), name=name))
        self._tasks += workers

    def _workers_for(self, instance: ModelInstance) -> int:
        """How many batches `instance` may have at once."""
        # An ensemble's runs only wait on other models: it runs several at once.
        concurrency = getattr(instance, "concurrency", None)
        if concurrency is not None:
            return int(concurrency)
        # A worker process's instance runs one batch at a time, but the next ones may wait
        # in the process already (see ModelInstance); a rate limiter wants each to ask its turn.
        depth = int(getattr(instance, "pipeline_depth", 1))
        if depth > 1 and self.pipelines and self._rate_limiter is None:
            self._pipelined = True
            return depth
        return 1

    def submit(self, request: InferenceRequest, *, admitted: bool = False) -> None:
        """Queues a request; its sink receives the response. Raises if it cannot queue.
        `admitted`: another worker took it from its client (the stop's check was made there)."""
        self._check_takes(request, admitted)
        request.queued_ns = now_ns()  # (`queued_ns` set: refusals that come later are the model's)
        cache = self.response_cache if self.answers_from_cache else None
        if cache is not None and cache.answer(request, self.statistics, self._admit_missed):
            return  # answered from the cache (or being looked up): it does not queue now
        try:
            self._queue_up(request)
        except CoreserveError:
            request.queued_ns = 0  # refused at the queue's door (full, a priority it lacks)
            raise

    def stopping(self) -> None:
        """The server stops: from now on a client's request is refused in Triton's words, while
        those queued and running go on, and so do the requests they make (ensemble steps, BLS)."""
        self._stopping = True

    def _stop_refuses(self, request: InferenceRequest) -> str | None:
        """Triton's refusal of a client's request while the server stops (None: taken)."""
        return stop_refusal(request.id)

    def _check_takes(self, request: InferenceRequest, admitted: bool = False) -> None:
        """Raises where the request cannot be taken: the model unloads, the server stops, or its
        client gave up while it was being decoded (counted as cancelled)."""
        if self._closed:
            raise self._unloading()
        if self._stopping and not admitted and not request.made_by_a_model():
            refusal = self._stop_refuses(request)
            if refusal is not None:
                raise UnavailableError(refusal)
        if request.is_cancelled():
            self.statistics.record_failure(request, "CANCELED")
            raise CancelledError.of_request(request.model_name)

    def _unloading(self) -> UnavailableError:
        name, version = self.signature.model_name, self.model_version
        return UnavailableError(f"model '{name}' version {version} is unloading")

    def _queue_up(self, request: InferenceRequest) -> None:
        self._enqueue(request)
        request.queue = self
        self._idle.clear()
        self._wake_worker()

    def _admit_missed(self, request: InferenceRequest) -> None:
        """Queues a request whose cache lookup missed after `submit` returned (a Redis cache)."""
        sink = request.sink
        assert sink is not None
        if self._closed:
            sink.fail(self._unloading())
        elif request.is_cancelled():
            self.statistics.record_failure(request, "CANCELED")
            sink.fail(CancelledError.of_request(request.model_name))
        else:
            try:
                self._queue_up(request)
            except CoreserveError as exc:  # what submit raises to its caller: a full queue, a bad priority
                sink.fail(exc)

    def withdraw(self, request: InferenceRequest) -> None:
        """Takes a cancelled request out of the queue, if it is still there, and fails it.

        One that an instance has taken already runs on; its backend sees `is_cancelled()`.
        """
        if not self._remove_queued(request):
            return
        self.statistics.record_failure(request, "CANCELED")
        if request.sink is not None:
            request.sink.fail(CancelledError.of_request(request.model_name))

    def _enqueue(self, request: InferenceRequest) -> None:
        self._queue.append(request)

    def _remove_queued(self, request: InferenceRequest) -> bool:
        """Removes a request from the queue; False if it is not there (taken, or never queued)."""
        try:
            self._queue.remove(request)
        except ValueError:
            return False
        return True

    def _has_work(self, index: int) -> bool:
        """Whether instance `index` has something to take now (every instance takes from one queue)."""
        return bool(self.queue_size)

    async def _wait_for_work(self, index: int) -> None:
        """Waits until a request queues for instance `index` (see `_wake_worker`)."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((index, waiter))
        self._awake[index] -= 1  # (and one more once _wake_worker wakes it)
        await waiter

    async def _take_batch(self, index: int) -> list[InferenceRequest]:
        """The next batch for instance `index`, once `_has_work` said it has one; empty when
        there is none after all (the queue emptied meanwhile, or the batch waits for more)."""
        return [self._queue.popleft()]

    def _batch_done(self, index: int) -> None:
        """Called after each `_take_batch` of instance `index`, once that batch has run (or
        failed to): nothing to do here."""

    def _drain(self) -> Iterable[InferenceRequest]:
        """Removes and returns every queued request."""
        while self._queue:
            yield self._queue.popleft()

    def _send_what_waits(self) -> None:
        """Called when closing begins: a batch waiting for more requests must go at once, as
        Triton drains its queues on unload (the default scheduler never waits)."""

    def _wake_worker(self) -> None:
        """Wakes an idle worker for a request that queued: the longest idle, or, where
        instances take batches ahead, one of the instance with the fewest workers awake (a
        request must not wait behind another's execution while an instance idles)."""
        waiters = self._waiters
        while waiters and waiters[0][1].done():  # (cancelled: the scheduler is closing)
            waiters.popleft()
        if not waiters:
            return
        chosen = 0
        if self._pipelined:
            awake = self._awake
            for position, (index, waiter) in enumerate(waiters):
                if not waiter.done() and awake[index] < awake[waiters[chosen][0]]:
                    chosen = position
        index, waiter = waiters[chosen]
        del waiters[chosen]
        self._awake[index] += 1  # counted now: the next request of this turn goes elsewhere
        waiter.set_result(None)

    def _note_if_idle(self) -> None:
        """Marks the scheduler idle (what `close` waits for) when nothing is queued or running."""
        if self._busy == 0 and not self.queue_size:
            self._idle.set()

    async def _work(self, index: int, instance: ModelInstance) -> None:
        """The worker loop of instance `index`: takes batches and executes them, one at a time."""
        serving = getattr(instance, "serving", None)
        while index not in self._retired:
            if not self._has_work(index):
                self._note_if_idle()
                await self._wait_for_work(index)
                continue
            if serving is not None and not serving.is_set():
                # The instance restarts its worker process: what is queued stays in the queue
                # (where timeouts and cancellations reach it) for another instance or for this
                # one once it is back, and the work this worker was woken for goes elsewhere.
                self._wake_worker()
                await serving.wait()
                continue
            self._busy += 1
            self._in_batch.add(asyncio.current_task())  # type: ignore[arg-type]
            try:
                batch = await self._take_batch(index)
                if batch:
                    await self._execute(instance, batch)
                # An idle worker holds no finished requests: their tensors go now, and its
                # frame (kept by the CancelledError that ends it at close) makes no cycle
                # request.queue -> scheduler -> task, which kept an unloaded model's instances
                # alive until the garbage collector ran.
                del batch
            finally:
                self._busy -= 1
                self._in_batch.discard(asyncio.current_task())
                self._batch_done(index)

    async def _execute(self, instance: ModelInstance, batch: list[InferenceRequest]) -> None:
        """Executes a batch, counted as executing until it ends, but for the requests the
        instance hands back: queued again, they count as queued from then on (with
        preserve_ordering, the batch's turn may still wait for earlier ones)."""
        executing = len(batch)
        self._executing += executing
        try:
            # The limiter's turn is inside: a batch waiting for earlier ones must not hold resources.
            async with self._ordered.turn(batch) if self._ordered is not None else contextlib.nullcontext():
                responder = await self._execute_limited(instance, batch)
                if responder.rescheduled:
                    self._take_back(responder.rescheduled)
                if responder.requeued:
                    executing -= len(responder.requeued)
                    self._executing -= len(responder.requeued)
                    self._requeue(responder.requeued)
        finally:
            self._executing -= executing

    async def _execute_limited(self, instance: ModelInstance, batch: list[InferenceRequest]) -> Responder:
        limiter = self._rate_limiter
        if limiter is None:
            return await self._execute_batch(instance, batch)
        async with limiter.turn(self._slots[id(instance)], len(batch)):
            return await self._execute_batch(instance, batch)

    def _execute_batch(self, instance: ModelInstance, batch: list[InferenceRequest]) -> Awaitable[Responder]:
        return execute_batch(
            instance, batch, self.signature, self.statistics, decoupled=self.decoupled, streams=self._streams
        )

    def _take_back(self, requests: Sequence[InferenceRequest]) -> None:
        """Requests a backend handed back to be executed again: only iterative sequences take
        them (SequenceBatcher); here each fails with Triton's error."""
        for request in requests:
            logger.error(
                "model '%s' version %s: failed to release request '%s': %s",
                self.signature.model_name,
                self.model_version,
                request.id,
                RESCHEDULE_REFUSED,
            )
            self.statistics.record_failure(request, "BACKEND")
            if request.sink is not None:
                request.sink.fail(InternalError(RESCHEDULE_REFUSED))

    def _requeue(self, requests: Sequence[tuple[InferenceRequest, CoreserveError]]) -> None:
        """Queues again, ahead of younger ones, requests an instance handed back unstarted
        (`Responder.requeue`); one cancelled meanwhile leaves as from the queue."""
        for request, _ in requests:
            unhold(request)
            if request.is_cancelled():
                self.statistics.record_failure(request, "CANCELED")
                if request.sink is not None:
                    request.sink.fail(CancelledError.of_request(request.model_name))
                continue
            self._enqueue_by_age(request)
            self._idle.clear()
            self._wake_worker()

    def _enqueue_by_age(self, request: InferenceRequest) -> None:
        """Puts a request taken from the queue back where its age places it: near the head,
        behind the older ones handed back before it (each execution hands back its own)."""
        insert_by_age(self._queue, request)

    async def close(self, timeout: float | None = None) -> bool:
        """Stops taking requests, lets queued and running ones finish (a decoupled request until
        its last response), fails the rest, then closes the instances; `timeout` seconds bound
        all of it (an instance still closing then is cancelled, see `ModelInstance.close`).
        Returns whether all of it ended in time."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        in_time = True
        self._closed = True
        self._send_what_waits()
        if self.response_cache is not None:
            self.response_cache.close()  # its answers go with it (unload, or a reload's new files)
        if self.in_flight or self._busy:
            try:
                await asyncio.wait_for(self._idle.wait(), timeout)
            except TimeoutError:
                in_time = False
                logger.warning(
                    "model '%s' version %s: %d requests still queued after %.1fs; failing them",
                    self.signature.model_name,
                    self.model_version,
                    self.queue_size,
                    timeout,
                )
        if in_time and self._streams:  # decoupled requests still answering: their model stays
            remaining = None if deadline is None else max(0.0, deadline - loop.time())
            try:
                await asyncio.wait_for(self._streams.ended(), remaining)
            except TimeoutError:
                in_time = False
                logger.warning(
                    "model '%s' version %s: %d decoupled requests still answering at the exit timeout",
                    self.signature.model_name,
                    self.model_version,
                    len(self._streams),
                )
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()  # a finished task's exception holds its frames: nothing must lead back here
        self._workers.clear()
        for request in self._drain():
            if request.sink is not None:
                request.sink.fail(UnavailableError(f"model '{self.signature.model_name}' was unloaded"))
        if self._rate_limiter is not None:
            self._rate_limiter.unregister(self._slots.values())
        remaining = None if deadline is None else max(0.0, deadline - loop.time())
        return await close_instances(self.instances, remaining, self.signature.model_name) and in_time
