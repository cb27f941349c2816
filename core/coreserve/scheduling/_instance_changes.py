"""Changing a serving scheduler's instances: a reload that changed only `instance_group` adds
and retires instances in place, as Triton's does, while the others go on serving."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from coreserve.backend.api import ModelInstance
from coreserve.config.signature import ModelSignature
from coreserve.scheduling._execution import close_instances
from coreserve.scheduling.rate_limiter import InstanceSlot, RateLimiter


class InstanceChanges:
    """The part of `Scheduler` that adds and retires instances; instance indices only grow, so
    a retired instance's index is never another's."""

    signature: ModelSignature
    instances: list[ModelInstance]
    _awake: list[int]
    _slots: dict[int, InstanceSlot]
    _rate_limiter: RateLimiter | None
    _tasks: list[asyncio.Task[None]]
    _workers: dict[int, tuple[ModelInstance, list[asyncio.Task[None]]]]
    _in_batch: set[asyncio.Task[None]]
    _retired: set[int]
    _closed: bool

    @property
    def closed(self) -> bool:
        """Whether it closed: its instances are closed, and no change is made any more."""
        return self._closed

    def _start_workers(self, index: int, instance: ModelInstance) -> None:
        raise NotImplementedError

    def _wake_worker(self) -> None:
        raise NotImplementedError

    def _note_if_idle(self) -> None:
        raise NotImplementedError

    @property
    def queue_size(self) -> int:
        raise NotImplementedError

    def add_instances(self, instances: Sequence[ModelInstance], slots: Sequence[InstanceSlot] = ()) -> None:
        """Starts serving with more instances (a reload that changed only `instance_group`);
        `slots`: their places in the rate limiter, one each, where the scheduler has one."""
        places: Sequence[InstanceSlot | None] = slots or [None] * len(instances)
        for instance, slot in zip(instances, places, strict=True):
            index = len(self._awake)  # (indices are never reused: a retired one's workers may still end)
            self.instances.append(instance)
            self._awake.append(0)
            if slot is not None:
                self._slots[id(instance)] = slot
            self._start_workers(index, instance)

    async def retire_instances(self, instances: Sequence[ModelInstance]) -> bool:
        """Stops serving with `instances` (others remain): each ends the batch it runs, then is
        closed. Returns whether every one closed cleanly (see `close_instances`)."""
        gone = {id(instance) for instance in instances}
        indices = {index for index, (instance, _) in self._workers.items() if id(instance) in gone}
        instances = [self._workers[index][0] for index in indices]  # (none once the scheduler closed)
        self._retired |= indices
        workers = [task for index in indices for task in self._workers.pop(index)[1]]
        for task in workers:
            if task not in self._in_batch:
                task.cancel()  # (waiting for work, or for its process's restart)
                if self.queue_size:
                    self._wake_worker()  # the request that may have woken it goes to another
        await asyncio.gather(*workers, return_exceptions=True)
        self._tasks = [task for task in self._tasks if task not in workers]
        self.instances = [instance for instance in self.instances if id(instance) not in gone]
        if self._rate_limiter is not None:
            self._rate_limiter.unregister([self._slots.pop(id(instance)) for instance in instances])
        self._note_if_idle()  # (a retired worker ends without looking for more work)
        return await close_instances(instances, None, self.signature.model_name)
