"""The supervisor: the `coreserve` process that runs N workers and makes them one server.

Each worker is a whole server (`coreserve` with the same flags, its own models and frontends)
bound to the same ports with SO_REUSEPORT, so the kernel spreads the connections over them.
The supervisor loads no model and answers no client: it starts the workers, relays what must
happen in every worker (a model loaded or unloaded, a shared-memory region registered, a log
or trace setting changed) and what must be gathered from every worker (statistics, metrics),
restarts a worker that dies, and stops them all on SIGTERM or SIGINT.

A worker that starts while others serve takes on what they serve (`repository.adoption`: a
serving worker's snapshot, loaded from the same files, not the repository as it is now), then is
told, before it opens its ports, the changes its snapshot does not hold (the replay: shared-memory
regions and settings, models loaded from files a request carried, and the changes made since). A
worker that cannot make all of it says so (its faults): the server is not ready until each is
mended. A change either holds in every live worker or is undone where it held: a model put back as
each worker had it, a region unregistered again; the first failure is the answer.

Every joined worker is asked every HEARTBEAT_S whether it is alive; one that does not answer
within `--worker-heartbeat-timeout-secs` is hung (stopped, or its event loop stuck): it is killed,
so that its listening sockets close and no new connection waits on it, and started again. Every
ask of a worker is bounded by that: a change a worker is making waits for it as long as it
answers the heartbeats (a model's load takes what it takes), and fails there when it is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from coreserve.errors import CoreserveError, InternalError, InvalidArgumentError, UnavailableError
from coreserve.server.changes import (
    Change,
    LoadModel,
    Registration,
    SetTraffic,
    UnloadModel,
    Unregistration,
    change_from,
    loads_files,
    message_of,
)
from coreserve.server.options import ServerOptions
from coreserve.server.workers._carried import ALL_STATISTICS, METRICS, REFRESH_S, CarriedFigures
from coreserve.server.workers._channel import Channel, ChannelClosed, error_data, message_limit
from coreserve.server.workers._orphans import become_subreaper, end_orphans, reap_orphans
from coreserve.server.workers._role import WORKER_ENV, WorkerRole, remove_cache_folder, supervisor_socket
from coreserve.server.workers._trust import LINE_ERRORS, STRANGER, peer_pid, peers_can_be_checked

logger = logging.getLogger(__name__)

RESTART_DELAY_S = 1.0
# A worker that failed to start MAX_FAILED_STARTS times in a row is tried again this seldom (the
# others serve meanwhile; the server is not ready without it).
FAILED_START_DELAY_S = 30.0
HEARTBEAT_S = 1.0  # how often each joined worker is asked whether it is alive
MAX_FAILED_STARTS = 5
STOP_MARGIN_S = 10.0  # past --exit-timeout-secs, a worker still running is killed
# What a worker must answer within, but for a change (a model's load takes what it takes).
GATHER_TIMEOUT_S = 30.0


@dataclass
class _Worker:
    index: int
    process: asyncio.subprocess.Process | None = None
    channel: Channel | None = None
    joined: bool = False  # it makes every change from now on
    served_since_start: bool = False  # kept when its line closes: a crash is not a failed start
    serving: bool = False  # it has made the changes made before it joined, and serves
    failed_starts: int = 0
    faults: dict[str, str] = field(default_factory=dict)  # what it does not serve as the others do
    adopted_at: int | None = None  # the last change its snapshot holds, where it took one on


class Supervisor:
    def __init__(self, argv: Sequence[str], options: ServerOptions) -> None:
        """`argv`: the command line each worker runs; `options`: what it says."""
        self.argv = list(argv)
        self.count = max(options.http_workers, options.grpc_workers)
        self.exit_timeout_s = options.exit_timeout_secs
        self.hung_after_s = options.worker_heartbeat_timeout_s
        self.message_limit = message_limit(options)
        self.workers = [_Worker(index) for index in range(self.count)]
        # Changes every worker must have made, by what they change (the last one of each kept),
        # each with its number in the order they were made.
        self._replay: dict[tuple[str, ...], tuple[int, dict[str, Any]]] = {}
        self._relaying = asyncio.Lock()  # one change at a time, and none while a worker joins
        self._changes = 0
        self._ever_served = False
        self._telling = asyncio.Lock()
        self._background: set[asyncio.Task[None]] = set()
        self._stopping = asyncio.Event()
        self._carried = CarriedFigures()
        self._exit_code = 0
        self._socket = ""

    async def run(self) -> int:
        """Runs the workers until a signal, or until the first of them fails to start."""
        if not peers_can_be_checked():
            logger.error("several workers need a system that says which process is at the other end of a "
                         "Unix socket (SO_PEERCRED, as Linux does)")  # fmt: skip
            return 1
        if not become_subreaper():
            logger.warning("what a worker that dies leaves running (an environment's build) is not ended")
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self._stopping.set)
        with supervisor_socket() as self._socket:
            server = await asyncio.start_unix_server(self._connected, self._socket)
            logger.info("starting %d workers", self.count)
            watchers = [asyncio.create_task(self._keep_running(worker)) for worker in self.workers]
            watchers.append(asyncio.create_task(self._keep_figures()))
            await self._stopping.wait()
            await self._stop_workers()
            end_orphans(None, self._worker_pids())
            for watcher in watchers:
                watcher.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
            server.close()
        logger.info("coreserve stopped")
        return self._exit_code

    async def _keep_running(self, worker: _Worker) -> None:
        """Starts `worker`, and again each time it dies, until the server stops."""
        while not self._stopping.is_set():
            role = WorkerRole(worker.index, self.count, self._socket)
            environment = {**os.environ, WORKER_ENV: role.encode()}
            worker.served_since_start = False
            worker.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "coreserve", *self.argv, env=environment, start_new_session=True
            )  # a session of its own: what it leaves running when it dies is told apart by it
            code = await worker.process.wait()
            # What it started (an environment's build) goes with it, and its cache folder.
            end_orphans(worker.process.pid, self._worker_pids() - {worker.process.pid})
            await asyncio.to_thread(remove_cache_folder, self._socket, worker.process.pid)
            await self._left(worker)
            if self._stopping.is_set():
                return
            delay = RESTART_DELAY_S
            if not worker.served_since_start:
                worker.failed_starts += 1
                if not self._ever_served:
                    # As one server would: a start that fails (a port taken, a model that does not
                    # load under --exit-on-error) ends the server with the worker's status.
                    logger.error(
                        "worker %d exited with status %d before serving; stopping", worker.index, code
                    )
                    self._exit_code = code or 1
                    self._stopping.set()
                    return
                if worker.failed_starts >= MAX_FAILED_STARTS:  # the others serve on without it
                    delay = FAILED_START_DELAY_S
            else:
                worker.failed_starts = 0
            logger.error(
                "worker %d exited with status %d; starting it again in %g s", worker.index, code, delay
            )
            await asyncio.sleep(delay)

    async def _left(self, worker: _Worker) -> None:
        """A worker's process ended: its line too, if it is still open."""
        channel = worker.channel
        if channel is not None:
            self._line_closed(channel)
            await channel.close()
        else:
            self._carried.died(worker.index)  # (no-op where its line's end carried it already)
            worker.joined = worker.serving = False

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        pid = peer_pid(writer)
        if pid is None or pid not in self._worker_pids():
            LINE_ERRORS.count(STRANGER)
            logger.warning("refused a connection to the workers' line from process %s, no worker", pid)
            writer.close()
            return

        async def handle(message: dict[str, Any]) -> Any:
            return await self._handle(message, channel, pid)

        channel = Channel(reader, writer, handle, self.message_limit)
        await channel.closed.wait()
        self._line_closed(channel)

    def _line_closed(self, channel: Channel) -> None:
        """A worker's line ended (it died, or is dying): from now on what it counted is carried
        (a read of the statistics then never misses its counts), and it makes no more changes."""
        for worker in self.workers:
            if worker.channel is channel:
                self._carried.died(worker.index)
                worker.joined = worker.serving = False
                worker.channel = None
                self._in_background(self._tell_readiness())

    def _worker_at(self, index: object, pid: int) -> _Worker:
        """The worker that process `pid`, a child of the supervisor, says it is: its own index only."""
        worker = self.workers[index] if isinstance(index, int) and 0 <= index < self.count else None
        if worker is None or worker.process is None or worker.process.pid != pid:
            raise InvalidArgumentError(f"process {pid} is not worker {index}")
        return worker

    async def _handle(self, message: dict[str, Any], channel: Channel, pid: int) -> Any:
        call = message["call"]
        if call == "truth":  # what a worker that starts takes on: the serving workers' state
            worker = self._worker_at(message.get("index"), pid)
            async with self._relaying:  # and the last change that state holds
                truth = await self._truth(worker) if message.get("adopt") else None
                worker.adopted_at = self._changes if truth is not None else None
            return truth
        if call == "join":
            worker = self._worker_at(message.get("index"), pid)
            async with self._relaying:  # no change may slip between the replay and the join
                worker.channel, worker.joined = channel, True
                replay = self._replay_after(worker.adopted_at)
            self._in_background(self._watch(worker, channel))
            return replay
        if not any(worker.channel is channel for worker in self.workers):
            raise InvalidArgumentError(f"'{call}' from a worker that has not joined")
        if call == "serving":
            worker = self._worker_at(message.get("index"), pid)
            worker.serving, worker.faults, self._ever_served = True, dict(message.get("faults") or {}), True
            worker.served_since_start = True
            self._in_background(self._tell_readiness())
            self._in_background(self._retell_states())  # for the copies its replay loaded
            return None
        if call == "faults":  # what a worker does not serve as the others do changed
            self._worker_at(message.get("index"), pid).faults = dict(message.get("faults") or {})
            self._in_background(self._tell_readiness())
            return None
        if call == "everywhere":
            await self._everywhere(message["what"])
            return None
        if call == "in_worker_0":  # a rollout's call (no time limit: the heartbeat ends a hung worker)
            first = self.workers[0].channel if self.workers[0].joined else None
            if first is None:
                raise UnavailableError("worker 0 does not serve now (it starts again); try again")
            return await first.ask(message["what"], None)
        if call == "gather":  # each worker's answer or error, and the carried: the asker adds up
            what = message["what"]
            answers = await self._ask_living(what, GATHER_TIMEOUT_S)
            carried = self._carried.for_gather(what)
            if what == METRICS and LINE_ERRORS.counts:  # the lines this process closed
                carried.append(LINE_ERRORS.render())
            answered = [
                {"error": error_data(a)} if isinstance(a, Exception) else {"result": a} for a in answers
            ]
            return {"answers": answered, "carried": carried}
        raise InternalError(f"the supervisor does not know '{call}'")

    async def _everywhere(self, what: dict[str, Any]) -> None:
        """Makes a change (a message of `coreserve.server.changes`) in every worker, or in none:
        where it failed in some, it is undone in those that made it (`_undo`). A worker that
        left meanwhile makes it when it starts again. The first failure is the answer."""
        change = change_from(what)
        async with self._relaying:
            answers = await self._ask_all({"call": "change", "what": what}, None)
            made = [(channel, answer) for channel, answer in answers if not isinstance(answer, Exception)]
            failed = [a for _, a in answers if isinstance(a, Exception) and not isinstance(a, ChannelClosed)]
            if failed and made:
                await self._undo(change, what, made, failed[0])
            elif not failed:
                self._remember(change, what)
            if made and isinstance(change, LoadModel | UnloadModel):
                self._carried.forget_model(change.name)
                await self._retell_states()
        if failed:
            raise failed[0]

    async def _undo(
        self, change: Change, what: dict[str, Any], made: list[tuple[Channel, Any]], failure: Exception
    ) -> None:
        """A change that failed in some workers, undone in those that made it: a model put back
        as each had it (a worker that cannot is not ready until the model is loaded again), a
        region unregistered again (the client may retry), a traffic policy set back. A settings
        change stays made, and is kept for the workers that start later."""
        if isinstance(change, LoadModel | UnloadModel):
            message = failure.message if isinstance(failure, CoreserveError) else str(failure)
            restore = {"call": "restore", "name": change.name, "failure": message}
            kept = self._replay.get(("model", change.name))
            undo = [
                # A model loaded from files its request carried comes back by that request again.
                channel.ask({"call": "change", "what": kept[1]})
                if kept is not None and (answer["before"] or {}).get("from_files")
                else channel.ask({**restore, "before": answer["before"]})
                for channel, answer in made
            ]
        elif isinstance(change, Registration):
            undone = {"call": "change", "what": message_of(change.undo())}
            undo = [channel.ask(undone, GATHER_TIMEOUT_S) for channel, _ in made]
        elif isinstance(change, SetTraffic):  # each worker's policy before it, set again
            undo = [
                channel.ask({"call": "change", "what": message_of(replace(change, policy=answer["before"]))})
                for channel, answer in made
            ]
        else:
            self._remember(change, what)
            return
        await asyncio.gather(*undo, return_exceptions=True)

    async def _truth(self, joining: _Worker) -> list[dict[str, Any]] | None:
        """What the serving workers serve (one's snapshot), or None where none serves as the
        others do (the server starts: the worker loads what the control mode says)."""
        for source in self.workers:
            if source is not joining and source.serving and not source.faults and source.channel is not None:
                with contextlib.suppress(CoreserveError):
                    return list(await source.channel.ask({"call": "snapshot"}, self.hung_after_s))
        return None

    def _replay_after(self, adopted_at: int | None) -> list[dict[str, Any]]:
        """The changes a joining worker makes: all of them, or where it took a snapshot on (made
        after change `adopted_at`), those it does not hold: every change but the models' made
        up to it, and the loads whose files their request carried."""
        return [
            what
            for key, (number, what) in self._replay.items()
            if adopted_at is None or key[0] != "model" or number > adopted_at or loads_files(what)
        ]

    async def _watch(self, worker: _Worker, channel: Channel) -> None:
        """Asks a joined worker every HEARTBEAT_S whether it is alive, while it keeps this line;
        one that does not answer in time is hung: killed, and then started again."""
        while worker.channel is channel and not self._stopping.is_set():
            try:
                await channel.ask({"call": "ping"}, self.hung_after_s)
            except ChannelClosed:
                return
            except UnavailableError:  # no answer within the heartbeat timeout
                if worker.channel is channel and not self._stopping.is_set():
                    self._kill_hung(worker)
                return
            await asyncio.sleep(HEARTBEAT_S)

    def _kill_hung(self, worker: _Worker) -> None:
        logger.error(
            "worker %d has not answered for %g s: it is hung; killing it (it starts again)",
            worker.index,
            self.hung_after_s,
        )
        worker.serving = False
        self._in_background(self._tell_readiness())
        if worker.process is not None and worker.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                worker.process.kill()

    async def _retell_states(self) -> None:
        """Has worker 0 tell the others its models' states once every worker has made a
        model's change, or a worker that started again serves: each judges its new copy of a
        model that worker 0 serves for all by how worker 0's load of it went (what worker 0
        told while the others still loaded is not taken as of their load)."""
        owner = self.workers[0]
        if owner.joined and owner.channel is not None:
            with contextlib.suppress(CoreserveError):
                await owner.channel.ask({"call": "tell_states"}, self.hung_after_s)

    async def _ask_all(self, what: dict[str, Any], timeout: float | None) -> list[tuple[Channel, Any]]:
        """`what` asked of every joined worker: each one's line, and its answer or error."""
        joined = [worker.channel for worker in self.workers if worker.joined and worker.channel is not None]
        answers = await asyncio.gather(
            *(channel.ask(what, timeout) for channel in joined), return_exceptions=True
        )
        return list(zip(joined, answers, strict=True))

    async def _ask_living(self, what: dict[str, Any], timeout: float | None) -> list[Any]:
        """A gather's `what` asked of every joined worker: the answers and errors of the workers
        still in the life that answered (one that died meanwhile is carried instead: its
        answer would count it twice), each answer noted for what it would carry."""
        joined = [(w, w.channel) for w in self.workers if w.joined and w.channel is not None]
        answers = await asyncio.gather(
            *(channel.ask(what, timeout) for _, channel in joined), return_exceptions=True
        )
        living = []
        for (worker, channel), answer in zip(joined, answers, strict=True):
            if isinstance(answer, ChannelClosed):
                self._line_closed(channel)  # carried now, before the asker adds the carried up
            elif worker.channel is channel:
                living.append(answer)
                if not isinstance(answer, Exception):
                    self._carried.seen(worker.index, what, answer)
        return living

    async def _keep_figures(self) -> None:
        """Notes every worker's figures now and then, for what a worker that dies had counted
        (and reaps what the processes ended after a worker's death left)."""
        while True:
            await asyncio.sleep(REFRESH_S)
            try:
                reap_orphans(self._worker_pids())
                for what in (METRICS, ALL_STATISTICS):
                    await self._ask_living(what, GATHER_TIMEOUT_S)
            except Exception:  # a fault of ours: logged, and the looks go on
                logger.exception("the supervisor could not look at the workers' figures")

    def _worker_pids(self) -> set[int]:
        return {worker.process.pid for worker in self.workers if worker.process is not None}

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _remember(self, change: Change, what: dict[str, Any]) -> None:
        """Keeps a change for the workers that start later: the last change of each model and
        region (an unregistered region is forgotten), and every settings change in order."""
        if isinstance(change, Unregistration):
            for forgotten in [kept for kept in self._replay if change.forgets(kept)]:
                del self._replay[forgotten]
            return
        self._changes += 1
        if isinstance(change, LoadModel | UnloadModel):  # the model's policy comes with it again
            self._replay.pop(("model", change.name, "traffic"), None)
        key = change.replay_key or ("in order", str(self._changes))
        self._replay.pop(key, None)
        self._replay[key] = (self._changes, what)

    async def _tell_readiness(self) -> None:
        """Each worker is ready to its clients only while every worker serves (one telling at a
        time, every joined worker told at once: a hung one holds up none of the others)."""
        async with self._telling:
            ready = all(worker.serving and not worker.faults for worker in self.workers)
            told = {"call": "peers_ready", "ready": ready}
            await self._ask_all(told, self.hung_after_s)

    async def _stop_workers(self) -> None:
        """SIGTERM to every worker: each drains within --exit-timeout-secs; then the rest is killed."""
        running = [w.process for w in self.workers if w.process is not None and w.process.returncode is None]
        for process in running:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        waits = [process.wait() for process in running]
        try:
            await asyncio.wait_for(asyncio.gather(*waits), self.exit_timeout_s + STOP_MARGIN_S)
        except TimeoutError:
            for process in running:
                if process.returncode is None:
                    logger.error("a worker did not stop within --exit-timeout-secs; killing it")
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()
            await asyncio.gather(*(process.wait() for process in running))
        self._exit_code = self._exit_code or int(any(p.returncode for p in running))  # work cut, or killed
