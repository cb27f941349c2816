"""Worker 0's side of the models only it serves: it runs the requests the other workers send
(`_forwarding`) and tells them the states of those models.

A request comes checked (its inputs reshaped, its batch size known) and goes straight to the
model version's scheduler, in the order it came: a sequence's requests keep their order
whichever worker they arrived at. It is counted in worker 0's statistics only, where it runs.
One checked against a configuration whose interface (inputs, outputs, batch size,
transaction policy) is not the version's here (where a reload failed here and the loaded
version serves on, or one of the two loads is not done) is refused: its tensors were checked
for that other one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from coreserve.errors import CoreserveError, InternalError, UnavailableError
from coreserve.repository import single_copy_reason
from coreserve.repository.model import ModelState, ModelVersion
from coreserve.server.dataplane import DataPlane
from coreserve.server.workers._channel import error_data
from coreserve.server.workers._forwarding import another_configuration
from coreserve.server.workers._line_frames import (
    Frame,
    FrameError,
    Pieces,
    frame,
    read_frame,
    request_from,
    response_frame,
)
from coreserve.server.workers._trust import LINE_ERRORS, MALFORMED, STRANGER, parent_pid, peer_pid
from coreserve.types import InferenceRequest, InferenceResponse

logger = logging.getLogger(__name__)

# How long a worker 0 that starts waits for the other workers' lines before it serves (one
# of them may be starting again itself).
LINES_WAIT_S = 10.0
# How often worker 0 looks whether a model's state changed by itself (an instance failed, a
# poll or an on-demand load), besides after each change a client asks for.
STATE_CHECK_S = 1.0


def owner_socket(supervisor_socket: str) -> str:
    """Where worker 0 takes the other workers' requests: beside the supervisor's socket."""
    return str(Path(supervisor_socket).with_name("owner.sock"))


class ForwardedRequests:
    """The Unix socket server in worker 0 that the other workers send requests to."""

    def __init__(self, dataplane: DataPlane, path: str) -> None:
        self._dataplane = dataplane
        self._path = path
        self._server: asyncio.Server | None = None
        self._lines: set[_Line] = set()
        self._states: dict[str, dict[str, list[object]]] = {}
        self._watch: asyncio.Task[None] | None = None
        self._connections = asyncio.Condition()

    async def start(self, others: int) -> None:
        """Listens; returns once the `others` workers are connected (or after LINES_WAIT_S):
        a worker 0 that starts again serves when the others can send it requests again."""
        with contextlib.suppress(FileNotFoundError):
            Path(self._path).unlink()  # left by the worker 0 that ran before this one
        self._states = self.states()
        self._server = await asyncio.start_unix_server(self._connected, self._path)
        self._watch = asyncio.create_task(self._watch_states())
        async with self._connections:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._connections.wait_for(lambda: len(self._lines) >= others), LINES_WAIT_S
                )

    def states(self) -> dict[str, dict[str, list[object]]]:
        """Each single-copy model's loaded versions: [takes requests, ready, why not, interface
        digest] (one still loading is left out: the others' copies say nothing of it until it
        is settled)."""
        states: dict[str, dict[str, list[object]]] = {}
        for model in self._dataplane.repository.models():
            if model.config is None or not single_copy_reason(model.config):
                continue
            states[model.name] = {
                str(number): [
                    version.takes_requests,
                    version.ready,
                    _reason(version),
                    version.interface_digest,
                ]
                for number, version in model.versions.items()
                if version.state in (ModelState.READY, ModelState.UNAVAILABLE)
            }
        return states

    def tell_states(self, again: bool = False) -> None:
        """Tells every other worker the models' states, where they changed since last told (or
        `again`: also where they did not)."""
        states = self.states()
        if again or states != self._states:
            self._states = states
            for line in self._lines:
                line.send(frame({"states": states}))

    async def _watch_states(self) -> None:
        while True:
            await asyncio.sleep(STATE_CHECK_S)
            self.tell_states()

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        pid = peer_pid(writer)
        if pid is None or pid == os.getpid() or parent_pid(pid) != os.getppid():
            LINE_ERRORS.count(STRANGER)
            logger.warning("worker 0 refused a connection from process %s, which is no worker", pid)
            writer.close()
            return
        line = _Line(self._dataplane, writer)
        line.send(frame({"states": self._states}))
        async with self._connections:
            self._lines.add(line)
            self._connections.notify_all()
        try:
            await line.serve(reader)
        finally:
            line.close()
            async with self._connections:
                self._lines.discard(line)
                self._connections.notify_all()

    async def others_gone(self, timeout: float) -> None:
        """Waits (at most `timeout` seconds) until every other worker's line has ended: they
        have stopped, and sent their last traces."""
        async with self._connections:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._connections.wait_for(lambda: not self._lines), timeout)

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        if self._server is not None:
            self._server.close()
        for line in list(self._lines):
            line.close()


def _number(header: dict[str, object]) -> int:
    number = header.get("n")
    if not isinstance(number, int):
        raise FrameError("a frame between workers without its request's number", MALFORMED)
    return number


def _sent_of(received: Frame) -> _Sent:
    """The request a frame carries (FrameError where its fields cannot be read)."""
    try:
        return _Sent(_number(received.header), request_from(received), str(received.header["interface"]))
    except FrameError:
        raise
    except (KeyError, TypeError, ValueError, CoreserveError) as exc:
        text = exc.message if isinstance(exc, CoreserveError) else f"{type(exc).__name__}: {exc}"
        raise FrameError(f"a request frame between workers that cannot be read ({text})", MALFORMED) from None


def _reason(version: ModelVersion) -> str:
    return version.current_reason or f"version {version.version} is {version.current_state.name}"


@dataclass
class _Sent:
    """A request another worker sent: its number on the line, and the interface digest of the
    configuration it was checked against there."""

    number: int
    request: InferenceRequest
    interface: str


class _Line:
    """One other worker's connection: its requests running here, by their numbers.

    Requests are handed to their schedulers in the order they come. Those of a model that is
    not loaded, where the server loads on demand, wait (in order) for its load, while the
    requests of other models go on.
    """

    def __init__(self, dataplane: DataPlane, writer: asyncio.StreamWriter) -> None:
        self._dataplane = dataplane
        self._writer = writer
        self.running: dict[int, InferenceRequest] = {}
        self._waiting: dict[str, list[_Sent]] = {}  # by model, for its load
        self._loads: set[asyncio.Task[None]] = set()

    def send(self, pieces: Pieces) -> None:
        if not self._writer.is_closing():
            self._writer.writelines(pieces)

    async def serve(self, reader: asyncio.StreamReader) -> None:
        """Takes the frames until the line ends; a frame the line must not take ends it."""
        try:
            while (received := await read_frame(reader)) is not None:
                try:
                    self._received(received)
                except FrameError:
                    raise
                except Exception:  # a fault of ours with one frame fails its request, not the line
                    logger.exception("a request from another worker could not be run")
                    number = received.header.get("n")
                    if isinstance(number, int):
                        self._fail(number, InternalError("worker 0 could not run the request"))
        except FrameError as exc:
            LINE_ERRORS.count(exc.reason)
            logger.warning("worker 0 closed a worker's line: %s", exc.message)
        except ConnectionError as exc:
            logger.warning("a worker's line to worker 0 broke: %s", exc)

    def _received(self, received: Frame) -> None:
        header = received.header
        if "trace" in header:
            self._dataplane.tracer.add_entries(bytes(received.payload))
        elif "cancel" in header:
            request = self.running.get(_number(header))
            if request is not None:
                request.cancel()
        else:
            sent = _sent_of(received)
            self.running[sent.number] = request = sent.request
            name = request.model_name
            waiting = self._waiting.get(name)
            if waiting is not None:  # behind the others of its model
                waiting.append(sent)
            elif self._dataplane.in_use(name, request.model_version) is None and self._on_demand():
                self._waiting[name] = [sent]
                load = asyncio.create_task(self._load_then_submit(name, request.model_version))
                self._loads.add(load)
                load.add_done_callback(self._loads.discard)
            else:
                self._submit(sent)

    def _on_demand(self) -> bool:
        return self._dataplane.repository.budgeted.on_demand

    async def _load_then_submit(self, name: str, version: str) -> None:
        with contextlib.suppress(CoreserveError):  # each request then gets its own lookup's error
            await self._dataplane.serving_version(name, version)
        for sent in self._waiting.pop(name, []):
            self._submit(sent)

    def _submit(self, sent: _Sent) -> None:
        request = sent.request
        try:
            target = self._dataplane.model_version(request.model_name, request.model_version)
            if target.scheduler is None:
                raise UnavailableError(f"model '{request.model_name}' version {target.version} is not loaded")
            if sent.interface != target.interface_digest:  # `serves`: the sender's copy is not this one
                error = UnavailableError(another_configuration(request.model_name, target.version))
                self._fail(sent.number, error, serves=target.interface_digest)
                return
            request.sink = _Replies(self, sent.number)
            target.scheduler.submit(request, admitted=True)  # (its worker took it: worker 0 serves it)
        except CoreserveError as exc:
            self._fail(sent.number, exc)

    def _fail(self, number: int, error: CoreserveError, **more: object) -> None:
        self.running.pop(number, None)
        self.send(frame({"n": number, "error": error_data(error), **more}))

    def close(self) -> None:
        """The worker went away: nobody waits for its requests any more."""
        for load in self._loads:
            load.cancel()
        self._waiting.clear()
        for request in list(self.running.values()):
            request.cancel()
        self.running.clear()
        self._writer.close()


class _Replies:
    """The sink of a request that another worker sent: its responses go back on the line."""

    def __init__(self, line: _Line, number: int) -> None:
        self._line = line
        self._number = number
        self._done = False

    @property
    def done(self) -> bool:
        return self._done

    def send(self, response: InferenceResponse | None, final: bool) -> None:
        if final:
            self._end()
        self._line.send(response_frame(self._number, response, final))

    def fail(self, error: CoreserveError) -> None:
        self._end()
        self._line.send(frame({"n": self._number, "error": error_data(error)}))

    def _end(self) -> None:
        self._done = True
        self._line.running.pop(self._number, None)
