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
from coreserve.server.changes import Change, change_from, message_of
from coreserve.server.dataplane import DataPlane
from coreserve.server.metrics import MetricsReport
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
        dataplane.flags.peers_ready = False  # until the supervisor says every worker serves
        # Worker 0 serves the single-copy models for all; the others send it their requests.
        path = owner_socket(role.socket)
        self._owner = ForwardedRequests(dataplane, path) if role.index == 0 else None
        self.owner_link = OwnerLink(path) if role.index != 0 else None
        # One Triton-format trace file, written by worker 0, with every worker's traces.
        dataplane.tracer.number_traces(role.index + 1, role.count)
        if self.owner_link is not None:
            dataplane.tracer.send_entries = self.owner_link.send_trace

    async def join(self) -> None:
        """Joins the server: makes, here, every change made since it started (a worker that
        starts again must serve what the others serve), then answers the supervisor's asks.
        Then `DataPlane.change` and the statistics and metrics go through the supervisor.
        Raises OSError where the supervisor's line cannot be reached."""
        if self.owner_link is not None:  # once worker 0 serves (and has told its models' states)
            await self.owner_link.start()
        reader, writer = await asyncio.open_unix_connection(self.role.socket)
        if peer_pid(writer) != os.getppid():  # another process took the supervisor's path
            writer.close()
            raise ConnectionRefusedError(f"{self.role.socket} is not this worker's supervisor's line")
        self._channel = Channel(reader, writer, self._answer, self._message_limit)
        for message in await self._channel.ask({"call": "join", "index": self.role.index}):
            try:
                await self._dataplane.apply_change(change_from(message))
            except CoreserveError as exc:  # as it failed nowhere else, it is this worker's to say
                logger.warning("worker %d: %s: %s", self.role.index, message["call"], exc.message)
        if self._owner is not None:  # with every model the others serve loaded
            await self._owner.start(self.role.count - 1)
        self._dataplane.peers = self
        if self._metrics is not None:
            self._metrics.peers = self
        await self._channel.ask({"call": "serving", "index": self.role.index})
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
        if call != "change":
            raise InvalidArgumentError(f"a worker does not know '{call}'")
        try:
            await self._dataplane.apply_change(change_from(ask["what"]))
        finally:
            if self._owner is not None:  # the others' readiness follows before the answer
                self._owner.tell_states()
        return None

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
