"""Each instance's pool of sequence slots, and how a change of instances grows or shrinks them.

A sequence holds a slot of one instance from its start to its end. A reload that changes only
`instance_group` changes the pools in place, as Triton's sequence batcher does: an added
instance's slots take new sequences at once (those waiting for a slot first); a retired instance
takes no new sequence and keeps serving the sequences it holds until the last ends or is released
idle, then it is closed, after the load has returned.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Sequence

from coreserve.backend.api import ModelInstance
from coreserve.config.signature import ModelSignature
from coreserve.scheduling._scheduler import Scheduler
from coreserve.scheduling.rate_limiter import InstanceSlot
from coreserve.scheduling.sequence._slot import SequenceSlot
from coreserve.scheduling.sequence._tensors import SequenceId
from coreserve.scheduling.statistics import ModelStatistics

logger = logging.getLogger(__name__)


class SlotPools(Scheduler):
    """The sequence batcher's base: the sequences, the slots of each instance (by index, as the
    scheduler's workers) and the sequences waiting for one."""

    def __init__(
        self,
        signature: ModelSignature,
        statistics: ModelStatistics,
        instances: Sequence[ModelInstance],
        slots_each: int,
        *,
        decoupled: bool,
    ) -> None:
        super().__init__(signature, statistics, instances, decoupled=decoupled)
        self._each = slots_each
        self._free = [slots_each] * len(self.instances)
        self._capacity = sum(self._free)
        self._ready = [asyncio.Event() for _ in self.instances]
        self._sequences: dict[SequenceId, SequenceSlot] = {}
        self._backlog: deque[SequenceSlot] = deque()
        # Retired instances that still hold sequences, by index: set once the last one is released.
        self._emptied: dict[int, asyncio.Event] = {}
        self._retirements: dict[int, asyncio.Task[bool]] = {}

    def _take_slot(self, sequence: SequenceSlot) -> None:
        """A slot for a new sequence, on the instance with the most free slots; else it waits."""
        pool = max(range(len(self._free)), key=lambda index: self._free[index])
        if self._free[pool] > 0:
            self._free[pool] -= 1
            sequence.slotted = True
            sequence.instance = pool
        else:
            self._backlog.append(sequence)

    def _free_slot(self, sequence: SequenceSlot) -> None:
        """Gives back the slot of a released sequence: to the sequence waiting longest or, on a
        retired instance, toward its closing."""
        index = sequence.instance or 0
        sequence.slotted = False
        emptied = self._emptied.get(index)
        if emptied is None:
            self._free[index] += 1
            self._seat_waiting()
        elif not self._holds(index):
            emptied.set()

    def _seat_waiting(self) -> None:
        while self._backlog and max(self._free) > 0:
            waiting = self._backlog.popleft()
            if self._sequences.get(waiting.id) is waiting:
                self._take_slot(waiting)
                self._notify(waiting)

    def _holds(self, index: int) -> int:
        return sum(
            1 for sequence in self._sequences.values() if sequence.slotted and sequence.instance == index
        )

    def _notify(self, sequence: SequenceSlot) -> None:
        if sequence.slotted and sequence.instance is not None:
            self._ready[sequence.instance].set()

    def _send_what_waits(self) -> None:
        for ready in self._ready:
            ready.set()  # each worker waiting for its batch to fill looks again, and sends it

    def add_instances(self, instances: Sequence[ModelInstance], slots: Sequence[InstanceSlot] = ()) -> None:
        self._free += [self._each] * len(instances)
        self._ready += [asyncio.Event() for _ in instances]
        self._capacity += self._each * len(instances)
        super().add_instances(instances, slots)
        self._seat_waiting()

    async def retire_instances(self, instances: Sequence[ModelInstance]) -> bool:
        """As the base's for the instances that hold no sequence. One that holds sequences takes
        no new one and stays until they end: it is closed after this returns (`close` awaits
        that), and what this returns is about the others."""
        gone = {id(instance) for instance in instances}
        now = []
        for index, (instance, _) in list(self._workers.items()):
            if id(instance) not in gone or index in self._emptied:
                continue
            self._capacity -= self._each
            self._free[index] = 0
            held = self._holds(index)
            if not held:
                now.append(instance)
                continue
            logger.info(
                "model '%s' version %s: a retired instance stays until its %d sequence(s) end",
                self.signature.model_name,
                self.model_version,
                held,
            )
            self._emptied[index] = asyncio.Event()
            self._retirements[index] = asyncio.create_task(self._retire_when_emptied(index, instance))
        return await super().retire_instances(now)

    async def _retire_when_emptied(self, index: int, instance: ModelInstance) -> bool:
        try:
            await self._emptied[index].wait()
            del self._emptied[index]
            return await super().retire_instances([instance])
        finally:
            del self._retirements[index]

    async def close(self, timeout: float | None = None) -> bool:
        for index, task in list(self._retirements.items()):
            if index in self._emptied:
                task.cancel()  # its sequences end as the others do, and it closes with them
        await asyncio.gather(*self._retirements.values(), return_exceptions=True)
        return await super().close(timeout)
