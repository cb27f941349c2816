"""A worker's line to its supervisor (`_supervisor`): how a worker is one part of one server.

Changes a client asks of the server (`DataPlane.change`) are relayed to every worker; the
statistics and the metrics are gathered from every worker and added up; the supervisor's
asks are answered here: a change to make, the figures of this worker, and whether every
worker is serving (until then this one is not ready). A worker whose supervisor is gone stops.

The models that must have one copy in the server (`single_copy_reason`) are loaded by worker 0
alone, which runs the requests the others send it (`ForwardedRequests`); the others load them
as schedulers that send their requests there (`OwnerLink`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from typing import Any

from coreserve.errors import CoreserveError, InvalidArgumentError
from coreserve.repository.adoption import restore, snapshot, snapshot_entry
from coreserve.server.changes import (
    Change,
    LoadModel,
    SetTraffic,
    UnloadModel,
    change_from,
    fault_key,
    forgets,
    message_of,
)
from coreserve.server.dataplane import DataPlane
from coreserve.server.metrics import MetricsReport
from coreserve.server.traffic import TRAFFIC_CALLS
from coreserve.server.workers._channel import Channel, ChannelClosed, error_from
from coreserve.server.workers._forwarding import OwnerLink
from coreserve.server.workers._merge import merge_metrics, merge_statistics
from coreserve.server.workers._owner import ForwardedRequests, owner_socket
from coreserve.server.workers._role import WorkerRole
from coreserve.server.workers._trust import LINE_ERRORS, peer_pid

logger = logging.getLogger(__name__)


class WorkerLink:
    def __init__(
        self,
        role: WorkerRole,
        dataplane: DataPlane,
        metrics: MetricsReport | None,
        shared_cache: bool,
        message_limit: int,
    ) -> None:
        """`shared_cache`: the response cache is one for every worker (Redis): its entries are
        counted once in the metrics. `message_limit`: the largest message the supervisor's line
        takes (`_channel.message_limit`)."""
        self.role = role
        self._message_limit = message_limit
        self._shared_cache = shared_cache
        self._dataplane = dataplane
        self._metrics = metrics
        self._channel: Channel | None = None
        self._watch: asyncio.Task[None] | None = None
        self.faults: dict[str, str] = {}  # what it does not serve as the others do, with why
        self._replayed = asyncio.Event()
        self._telling: set[asyncio.Task[Any]] = set()
        dataplane.flags.peers_ready = False  # until the supervisor says every worker serves
        # Worker 0 serves the single-copy models for all; the others send it their requests.
        path = owner_socket(role.socket)
        self._owner = ForwardedRequests(dataplane, path) if role.index == 0 else None
        self.owner_link = OwnerLink(path) if role.index != 0 else None
        # One Triton-format trace file, written by worker 0, with every worker's traces.
        dataplane.tracer.number_traces(role.index + 1, role.count)
        if self.owner_link is not None:
            dataplane.tracer.send_entries = self.owner_link.send_trace

    async def connect(self, adopt: bool) -> list[dict[str, Any]] | None:
        """Opens the line to the supervisor; returns what the serving workers serve (their
        `adoption.snapshot`), for this worker to take on, or None where none serves yet (the
        server starts: it loads what its control mode says) or it does not `adopt` (it loads
        on demand, for itself). Raises OSError where the line cannot be reached."""
        reader, writer = await asyncio.open_unix_connection(self.role.socket)
        if peer_pid(writer) != os.getppid():  # another process took the supervisor's path
            writer.close()
            raise ConnectionRefusedError(f"{self.role.socket} is not this worker's supervisor's line")
        self._channel = Channel(reader, writer, self._answer, self._message_limit)
        truth: list[dict[str, Any]] | None = await self._channel.ask(
            {"call": "truth", "index": self.role.index, "adopt": adopt}
        )
        return truth

    async def join(self, faults: dict[str, str]) -> None:
        """Joins the server: makes, here, every change made since what it loaded (a worker that
        starts again must serve what the others serve), then answers the supervisor's asks.
        Then `DataPlane.change` and the statistics and metrics go through the supervisor.
        `faults`: what this worker could not take on of what the others serve (by fault key,
        with why); a change of the replay that fails here is one too. While it has any, the
        server is not ready; a change that then holds here mends its fault."""
        assert self._channel is not None
        self.faults = dict(faults)
        if self.owner_link is not None:  # once worker 0 serves (and has told its models' states)
            await self.owner_link.start()
        for message in await self._channel.ask({"call": "join", "index": self.role.index}):
            change = change_from(message)
            try:
                await self._dataplane.apply_change(change)
            except CoreserveError as exc:  # made everywhere else: this worker is not what they are
                logger.error("worker %d could not make %s: %s", self.role.index, message["call"], exc.message)
                self.faults[fault_key(change)] = exc.message
        self._replayed.set()  # the changes asked from now on follow it
        if self._owner is not None:  # with every model the others serve loaded
            await self._owner.start(self.role.count - 1)
        self._dataplane.peers = self
        if self._metrics is not None:
            self._metrics.peers = self
        for key, reason in self.faults.items():
            logger.error("worker %d does not serve as the others do (%s): %s", self.role.index, key, reason)

    async def serving(self) -> None:
        """Tells the supervisor this worker serves: once it joined and its frontends listen (the
        metrics port is worker 0's alone: the server must not say it is ready before that)."""
        assert self._channel is not None
        await self._channel.ask({"call": "serving", "index": self.role.index, "faults": self.faults})
        self._watch = asyncio.create_task(self._stop_without_supervisor(self._channel))

    async def _answer(self, ask: dict[str, Any]) -> Any:
        call = ask["call"]
        if call == "ping":  # the supervisor's heartbeat: this worker's loop answers
            return None
        if call == "peers_ready":
            self._dataplane.flags.peers_ready = bool(ask["ready"])
            return None
        if call == "statistics":
            return self._dataplane.statistics(ask["name"], ask["version"])
        if call == "metrics":  # with the lines this worker closed
            own = await self._metrics.render_on_loop() if self._metrics is not None else ""
            return own + LINE_ERRORS.render()
        if call == "tell_states":  # in worker 0: every worker made a model's change, or one started again
            if self._owner is not None:
                self._owner.tell_states(again=True)
            return None
        if call == "snapshot":  # what this worker serves, for one that starts again to take on
            return snapshot(self._dataplane.repository)
        if call not in ("change", "restore", *TRAFFIC_CALLS):
            raise InvalidArgumentError(f"a worker does not know '{call}'")
        await self._replayed.wait()  # a change asked while the replay is made comes after it
        if call in TRAFFIC_CALLS:  # a rollout's windows, or (worker 0's) another worker's rollout call
            return await self._dataplane.traffic_control.answer(ask)
        if call == "restore":  # a model change that failed in another worker is undone here
            return await self._restore(ask["name"], ask["before"], ask["failure"])
        change = change_from(ask["what"])
        before = self._before(change)
        try:
            await self._dataplane.apply_change(change)
        finally:
            if self._owner is not None:  # the others' readiness follows before the answer
                self._owner.tell_states()
        self._mended(change)
        return {"before": before}

    def _before(self, change: Change) -> dict[str, Any] | None:
        """A model change's model, or a model's traffic policy, as it is here before the change
        (what its undo puts back)."""
        if isinstance(change, SetTraffic):
            policy = self._dataplane.repository.get(change.name).traffic
            return policy.as_dict() if policy is not None else {}
        if not isinstance(change, LoadModel | UnloadModel):
            return None
        model = next((m for m in self._dataplane.repository.models() if m.name == change.name), None)
        return snapshot_entry(model) if model is not None else None

    async def _restore(self, name: str, before: dict[str, Any] | None, failure: str) -> None:
        fault = await restore(self._dataplane.repository, name, before, failure)
        key = fault_key(UnloadModel(name))
        if fault:
            logger.error("worker %d could not undo a change of model '%s': %s", self.role.index, name, fault)
            self.faults[key] = fault
            self._tell_faults()
        elif self.faults.pop(key, None) is not None:
            self._tell_faults()
        if self._owner is not None:
            self._owner.tell_states()

    def _mended(self, change: Change) -> None:
        """A change that held here mends the fault it concerns (a model loaded again, a region
        registered again or unregistered)."""
        mended = [key for key in self.faults if key == fault_key(change) or forgets(change, key)]
        for key in mended:
            del self.faults[key]
        if mended:
            self._tell_faults()

    def _tell_faults(self) -> None:
        if self._channel is not None:
            told = self._channel.ask({"call": "faults", "index": self.role.index, "faults": self.faults})
            task = asyncio.create_task(told)
            self._telling.add(task)
            task.add_done_callback(self._telling.discard)
            task.add_done_callback(_quiet)

    async def everywhere(self, change: Change) -> None:
        await self._ask({"call": "everywhere", "what": message_of(change)})

    async def statistics(self, name: str, version: str) -> dict[str, Any]:
        """Every worker's statistics added up, with what workers that died had counted (a
        worker that lacks the model, or does not answer, is left out; where none answers, the
        first one's error is the answer)."""
        results, carried = await self._gather({"call": "statistics", "name": name, "version": version})
        return merge_statistics(results, carried)

    async def metrics(self) -> str:
        results, carried = await self._gather({"call": "metrics"})
        return merge_metrics(results, shared_cache=self._shared_cache, carried=carried)

    @property
    def index(self) -> int:
        return self.role.index

    @property
    def workers(self) -> int:
        return self.role.count

    async def from_every_worker(self, what: dict[str, Any]) -> list[Any]:
        """`what` asked of every worker: the answers of those that gave one (a worker that
        does not answer is left out; where none answers, the first one's error is raised)."""
        results, _ = await self._gather(what)
        return results

    async def from_worker_0(self, what: dict[str, Any]) -> Any:
        """Worker 0's answer to `what` (its error raised here; UnavailableError where worker 0
        does not serve now)."""
        return await self._ask({"call": "in_worker_0", "what": what})

    async def _gather(self, what: dict[str, Any]) -> tuple[list[Any], list[Any]]:
        gathered = await self._ask({"call": "gather", "what": what})
        answers = gathered["answers"]
        results = [answer["result"] for answer in answers if "result" in answer]
        if not results:
            errors = [error_from(answer["error"]) for answer in answers if "error" in answer]
            raise errors[0] if errors else ChannelClosed("no worker answered")
        return results, gathered["carried"]

    async def _ask(self, message: dict[str, Any]) -> Any:
        assert self._channel is not None
        return await self._channel.ask(message)

    async def _stop_without_supervisor(self, channel: Channel) -> None:
        await channel.closed.wait()
        if not self._dataplane.flags.stopping:
            logger.error("worker %d: the supervisor is gone; stopping", self.role.index)
            os.kill(os.getpid(), signal.SIGTERM)

    async def others_gone(self, timeout: float) -> None:
        """In worker 0, as it stops: waits (at most `timeout` seconds) for the other workers to
        stop, serving the requests they still send it, and taking their last traces for the
        trace file it writes."""
        if self._owner is not None:
            await self._owner.others_gone(timeout)

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        if self._owner is not None:
            await self._owner.close()
        if self.owner_link is not None:
            await self.owner_link.close()
        if self._channel is not None:
            await self._channel.close()


def _quiet(task: asyncio.Task[Any]) -> None:
    """A fault told while the supervisor's line closes is told again by no one: nothing to do."""
    if not task.cancelled():
        task.exception()
