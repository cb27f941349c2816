"""The rate limiter (`--rate-limit=execution_count`): instances execute only when their resources are free.

As Triton's: each instance of an `instance_group` may name resources it needs
(`rate_limiter { resources [ { name count global } ] priority }`). A resource is per device
unless `global`; how many copies exist is, by default, the most any loaded instance asks for,
or what `--rate-limit-resource NAME:COUNT[:DEVICE]` says (then every resource a model names
must be given by such a flag). An instance with a batch to run is *staged*; staged instances
are served in order of `exec_count * priority` (so a priority-2 instance gets half the turns
of a priority-1 one), and the first in that order waits until its resources are free, holding
back the ones behind it, so a large demand is never starved by small ones. Beyond Triton, a
model's `optimization { priority }` puts its instances ahead (PRIORITY_MAX) or behind
(PRIORITY_MIN) every instance of default priority.

One limiter serves every model of a server, on the server's event loop.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from coreserve.errors import ModelConfigError
from coreserve.protos.model_config_pb2 import ModelOptimizationPolicy, ModelRateLimiter

logger = logging.getLogger(__name__)
MODES = ("off", "execution_count")
# Where a resource lives: a device id, or GLOBAL for the one copy the whole server shares.
GLOBAL = -1
# A --rate-limit-resource without a device: the same count on every device.
EVERY_DEVICE = -2
# Model priority as an ordering tier: lower runs first.
_TIERS: dict[int, int] = {
    ModelOptimizationPolicy.PRIORITY_MAX: 0,
    ModelOptimizationPolicy.PRIORITY_DEFAULT: 1,
    ModelOptimizationPolicy.PRIORITY_MIN: 2,
}

Demand = dict[int, dict[str, int]]  # place (device id or GLOBAL) -> resource name -> count


class RateLimitSettingError(ValueError):
    """A --rate-limit-resource that cannot be read; the message says why, in one line."""


@dataclass(frozen=True)
class ResourceSetting:
    """One `--rate-limit-resource NAME:COUNT[:DEVICE]`."""

    name: str
    count: int
    device: int = EVERY_DEVICE


def parse_resource_setting(text: str) -> ResourceSetting:
    """A `--rate-limit-resource` value, checked as Triton checks it."""
    usage = (
        "--rate-limit-resource option format is '<resource_name>:<count>:<device>' or "
        f"'<resource_name>:<count>'. Got {text}"
    )
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0]:
        raise RateLimitSettingError(usage)
    try:
        numbers = [int(part) for part in parts[1:]]
    except ValueError:
        raise RateLimitSettingError(usage) from None
    if numbers[0] < 0 or (len(numbers) == 2 and numbers[1] < 0):
        raise RateLimitSettingError(f"{usage} (count and device must not be negative)")
    return ResourceSetting(parts[0], *numbers)


@dataclass(eq=False)
class InstanceSlot:
    """One model instance as the limiter sees it: what it needs and how often it ran."""

    label: str  # "model 'm' instance 2", for messages
    demand: Demand
    priority: int  # rate_limiter.priority; 0 counts as 1, as in Triton
    tier: int  # from the model's optimization.priority
    exec_count: int = 0
    waiting: int = 0  # requests in batches waiting for this instance's turn (still pending)
    _waiter: asyncio.Future[None] | None = field(default=None, repr=False)

    @property
    def scaled_priority(self) -> int:
        return self.exec_count * self.priority


class RateLimiter:
    """Lends resources to instances so that those needing the same resources take turns."""

    def __init__(self, settings: Sequence[ResourceSetting] = ()) -> None:
        self._explicit = list(settings)
        self._slots: list[InstanceSlot] = []
        self._limits: Demand = {}
        self._in_use: Demand = {}
        self._staged: list[tuple[int, int, int, InstanceSlot]] = []
        self._order = itertools.count()
        self._allocation_due = False

    def register(
        self,
        model_name: str,
        groups: Iterable[tuple[ModelRateLimiter, int]],
        model_priority: int = ModelOptimizationPolicy.PRIORITY_DEFAULT,
    ) -> list[InstanceSlot]:
        """Adds a model's instances, one (rate_limiter, device id) each, in order.

        Raises ModelConfigError (and adds nothing) when the resources cannot serve them all:
        a count that a --rate-limit-resource limits below what an instance needs, or a
        resource that is global in one place and per device in another (Triton's words).
        """
        slots = []
        for index, (config, device_id) in enumerate(groups):
            demand: Demand = {}
            for resource in config.resources:
                place = GLOBAL if getattr(resource, "global") else device_id
                demand.setdefault(place, {})[resource.name] = resource.count
            slots.append(
                InstanceSlot(
                    f"model '{model_name}' instance {index}",
                    demand,
                    max(config.priority, 1),
                    _TIERS.get(model_priority, 1),
                )
            )
        limits = _limits(self._slots + slots, self._explicit)
        self._slots.extend(slots)
        self._limits = limits
        self._log_limits()
        return slots

    def unregister(self, slots: Iterable[InstanceSlot]) -> None:
        """Removes instances that no longer execute (their model unloaded)."""
        gone = set(map(id, slots))
        self._slots = [slot for slot in self._slots if id(slot) not in gone]
        self._limits = _limits(self._slots, self._explicit, checked=False)
        self._log_limits()

    def _log_limits(self) -> None:
        """Triton's verbose account of how many copies of each resource exist, after each change
        (its QA reads it)."""
        if not logger.isEnabledFor(logging.DEBUG):
            return
        text = "\nMax Resource Map===>\n"
        for place, counts in sorted(self._limits.items()):
            if counts:
                text += f"\tDevice: {'GLOBAL' if place == GLOBAL else place}\n"
                text += "".join(
                    f"\t\tResource: {name}\t Count: {count}\n" for name, count in sorted(counts.items())
                )
        logger.debug("%s", text)

    @property
    def limits(self) -> Demand:
        """How many copies of each resource exist, per place."""
        return {place: dict(counts) for place, counts in self._limits.items()}

    @asynccontextmanager
    async def turn(self, slot: InstanceSlot, requests: int = 1) -> AsyncIterator[None]:
        """Waits until `slot` may execute a batch of `requests` (counted in its `waiting`
        meanwhile) and holds its resources while it does."""
        slot.waiting += requests
        try:
            await self._acquire(slot)
        finally:
            slot.waiting -= requests
        try:
            yield
        finally:
            slot.exec_count += 1
            self._release(slot)
            # Not at once: an instance with more to run stages again before its worker yields,
            # and should compete (by exec_count * priority) for what it just gave back, as in
            # Triton, rather than always hand it to whoever waited.
            self._allocate_soon()

    async def _acquire(self, slot: InstanceSlot) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        slot._waiter = waiter
        heapq.heappush(self._staged, (slot.tier, slot.scaled_priority, next(self._order), slot))
        self._allocate()
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release(slot)  # allocated just as its worker was cancelled
            else:
                waiter.cancel()  # _allocate skips it
            self._allocate()  # it may have held back the ones behind it
            raise

    def _release(self, slot: InstanceSlot) -> None:
        for place, counts in slot.demand.items():
            in_use = self._in_use[place]
            for name, count in counts.items():
                in_use[name] -= count

    def _allocate_soon(self) -> None:
        if not self._allocation_due:
            self._allocation_due = True
            asyncio.get_running_loop().call_soon(self._allocate)

    def _allocate(self) -> None:
        """Lets the staged instances run, in order, while the first one's resources are free."""
        self._allocation_due = False
        while self._staged:
            slot = self._staged[0][3]
            waiter = slot._waiter
            if waiter is None or waiter.done():  # its worker was cancelled
                heapq.heappop(self._staged)
                continue
            if not self._fits(slot.demand):
                return
            heapq.heappop(self._staged)
            for place, counts in slot.demand.items():
                in_use = self._in_use.setdefault(place, {})
                for name, count in counts.items():
                    in_use[name] = in_use.get(name, 0) + count
            waiter.set_result(None)

    def _fits(self, demand: Demand) -> bool:
        for place, counts in demand.items():
            limits = self._limits.get(place, {})
            in_use = self._in_use.get(place, {})
            for name, count in counts.items():
                # A limit lowered by an unload may be below a demand: it then runs alone.
                if in_use.get(name, 0) and in_use.get(name, 0) + count > limits.get(name, 0):
                    return False
        return True


def _limits(
    slots: Sequence[InstanceSlot], explicit: Sequence[ResourceSetting], *, checked: bool = True
) -> Demand:
    """The copies of each resource: the most any instance needs, or what the flags give."""
    needed: Demand = {}
    for slot in slots:
        for place, counts in slot.demand.items():
            most = needed.setdefault(place, {})
            for name, count in counts.items():
                most[name] = max(most.get(name, 0), count)
    if checked:
        for name in needed.get(GLOBAL, {}):
            if any(name in counts for place, counts in needed.items() if place != GLOBAL):
                raise ModelConfigError(
                    f'Resource "{name}" is present as both global and device-specific resource in the '
                    "model configuration."
                )
    if not explicit:
        return needed
    limits: Demand = {}
    for place, counts in needed.items():
        for name, count in counts.items():
            given = _explicit_count(explicit, name, place)
            if checked and given < count:
                raise ModelConfigError(
                    f'Resource count for "{name}" is limited to {given} which will prevent scheduling of '
                    f"one or more model instances, the minimum required count is {count}"
                    + ("" if given else f" (no --rate-limit-resource gives '{name}')")
                )
            limits.setdefault(place, {})[name] = given
    return limits


def _explicit_count(explicit: Sequence[ResourceSetting], name: str, place: int) -> int:
    """What the flags give of `name` at `place` (a global resource takes the largest given)."""
    counts = [
        setting.count
        for setting in explicit
        if setting.name == name and (place == GLOBAL or setting.device in (place, EVERY_DEVICE))
    ]
    return max(counts, default=0)
