"""The models one worker serves for all: in every other worker, their requests go to worker 0.

A model whose copies per worker would change what its configuration means (a sequence must
stay on one instance; GPU instances are counted per server: `single_copy_reason`) is loaded
by worker 0 only. Every other worker loads it as a `ForwardingScheduler`: its requests are
checked where they arrive (so a client sees the same errors from every worker), then sent on
this worker's one line to worker 0 (`OwnerLink`), whose answers come back to their sinks.
Worker 0 tells the models' states on the line, so that every worker reports the same
readiness; while the line is down (worker 0 restarts) they are unavailable here too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

from coreserve.errors import CoreserveError, InvalidArgumentError, UnavailableError
from coreserve.repository.model import ModelVersion
from coreserve.scheduling import Scheduler
from coreserve.server.workers._channel import error_from
from coreserve.server.workers._line_frames import (
    MAX_PAYLOAD_BYTES,
    Frame,
    FrameError,
    Pieces,
    entries_frame,
    frame,
    payload_size,
    read_frame,
    request_frame,
    response_from,
)
from coreserve.server.workers._trust import LINE_ERRORS, MALFORMED, STRANGER, parent_pid, peer_pid
from coreserve.types import InferenceRequest, now_ns

logger = logging.getLogger(__name__)

RECONNECT_DELAY_S = 0.2


def _unreachable(name: str) -> str:
    return f"worker 0, which serves model '{name}' for every worker, is not reachable"


def another_configuration(name: str, version: int) -> str:
    """Why a worker cannot send a model's requests to worker 0: worker 0 serves the model with
    another interface than this worker loaded (`ModelVersion.interface_digest`: worker 0's
    load of this configuration failed, its loaded version serving on, or one of the two loads
    is not done), so a request checked here is not checked for it."""
    return (
        f"worker 0, which serves model '{name}' for every worker, serves version {version} with "
        "other inputs, outputs, batch size or transaction policy than this worker loaded (a load "
        "of this configuration failed there, or is not done); load the model again once it loads"
    )


@dataclass
class _Sent:
    request: InferenceRequest
    version: ModelVersion
    forget_cancel: Callable[[], None]
    answered: Callable[[], None]  # its scheduler's count of requests out


class OwnerLink:
    """This worker's line to worker 0, shared by every model that worker 0 serves for all."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._writer: asyncio.StreamWriter | None = None
        self._sent: dict[int, _Sent] = {}
        self._next = 0
        # Worker 0's states of its single-copy models, by name and version: [takes requests,
        # ready, why not, interface digest] (None while the line is down), and how many times it
        # told them.
        self._states: dict[str, dict[str, list[object]]] | None = None
        self.states_told = 0
        # The versions worker 0 refused a request of because it serves them with another
        # interface: (name, version) -> the interface digest of this worker's copy, until
        # worker 0 tells it serves that one (or not the version at all).
        self._refused: dict[tuple[str, int], str] = {}
        self._keeping: asyncio.Task[None] | None = None
        self._states_known = asyncio.Event()  # set while worker 0's states are known here

    async def start(self) -> None:
        """Connects, and returns once worker 0 has told its models' states (it listens once it
        has loaded its models); connects again each time the line breaks."""
        self._keeping = asyncio.create_task(self._keep_connected())
        await self._states_known.wait()

    def scheduler_for(self, version: ModelVersion) -> ForwardingScheduler:
        return ForwardingScheduler(self, version)

    def verdict(self, version: ModelVersion, since: int) -> tuple[str, bool]:
        """Whether worker 0 serves that model version as this worker loaded it: why its
        requests are refused ("" while they are taken), and whether it is ready. `since`:
        `states_told` when this worker loaded it; what worker 0 told before is of an older
        load, and its own load is worker 0's to judge (the answer to the load says how it went
        there). Worker 0 serving it with another interface (its load of this configuration
        failed, the loaded version serving on), as told since or as its refusal of a request
        said, refuses it."""
        name = version.name
        if self._refused.get((name, version.version)) == version.interface_digest:
            return another_configuration(name, version.version), False
        if self.states_told <= since:
            return "", True
        if self._states is None:
            return _unreachable(name), False
        told = self._states.get(name, {}).get(str(version.version))
        if told is None:  # not loaded there: a request then loads it on demand, or fails there
            return "", True
        takes, ready, reason, interface = told
        if interface != version.interface_digest:
            return another_configuration(name, version.version), False
        return ("" if takes else str(reason)), bool(ready)

    def send(self, request: InferenceRequest, version: ModelVersion, answered: Callable[[], None]) -> None:
        """Sends `request` for `version` (checked against its configuration); `answered()`
        runs once it is answered (or failed)."""
        if self._writer is None or self._writer.is_closing():
            raise UnavailableError(_unreachable(request.model_name))
        number = self._next + 1
        pieces = request_frame(number, request, version.version, version.interface_digest)
        if payload_size(pieces) > MAX_PAYLOAD_BYTES:
            raise InvalidArgumentError(
                f"request for model '{request.model_name}' is too large to send to worker 0, which serves "
                f"it ({payload_size(pieces)} bytes of tensors; at most {MAX_PAYLOAD_BYTES})"
            )
        self._next = number
        forget_cancel = request.on_cancel(lambda: self._cancel(number))
        self._sent[number] = _Sent(request, version, forget_cancel, answered)
        self._writer.writelines(pieces)

    def send_trace(self, entries: bytes) -> None:
        """Sends a finished trace's entries to worker 0's trace file (lost while the line is down)."""
        self._write(entries_frame(entries))

    def _cancel(self, number: int) -> None:
        if number in self._sent:
            self._write(frame({"n": number, "cancel": True}))

    def _write(self, pieces: Pieces) -> None:
        if self._writer is not None and not self._writer.is_closing():
            self._writer.writelines(pieces)

    async def _keep_connected(self) -> None:
        warned = False
        while True:
            try:
                reader, writer = await asyncio.open_unix_connection(self._path)
            except OSError as exc:
                if not warned:
                    logger.info("waiting for worker 0 (%s)", exc.strerror or exc)
                    warned = True
                await asyncio.sleep(RECONNECT_DELAY_S)
                continue
            warned = False
            pid = peer_pid(writer)
            if pid is None or parent_pid(pid) != os.getppid():  # another process took worker 0's path
                LINE_ERRORS.count(STRANGER)
                logger.warning("the line to worker 0 reached process %s, which is no worker here", pid)
                writer.close()
                await asyncio.sleep(RECONNECT_DELAY_S)
                continue
            self._writer = writer
            try:
                await self._read(reader)
            finally:
                self._writer = None
                self._states = None
                self._states_known.clear()
                writer.close()
                self._fail_all(UnavailableError("worker 0 stopped before it answered"))
            await asyncio.sleep(RECONNECT_DELAY_S)

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while (received := await read_frame(reader)) is not None:
                try:
                    self._received(received)
                except FrameError:
                    raise
                except Exception:  # a fault of ours with one frame fails its request, not the line
                    logger.exception("worker 0's answer could not be handed on")
                    self._fail(received.header.get("n"), UnavailableError("worker 0's answer was malformed"))
        except FrameError as exc:
            LINE_ERRORS.count(exc.reason)
            logger.warning("the line to worker 0 closed: %s", exc.message)
        except ConnectionError as exc:
            logger.warning("the line to worker 0 broke: %s", exc)

    def _received(self, received: Frame) -> None:
        header = received.header
        if "states" in header:
            self._told(_states_of(header))
            return
        number = header.get("n")
        sent = self._sent.get(number) if isinstance(number, int) else None
        if sent is None:
            return  # a request failed here already (its sink took an error): nobody waits
        try:
            error = error_from(header["error"]) if "error" in header else None
            final = bool(header["final"]) if error is None else True
            response = response_from(received, sent.request.model_name) if error is None else None
        except (KeyError, TypeError, ValueError, CoreserveError) as exc:
            raise FrameError(f"an answer from worker 0 that cannot be read ({exc!r})", MALFORMED) from None
        sink = sent.request.sink
        assert sink is not None and isinstance(number, int)
        if error is not None:
            if "serves" in header:  # worker 0 serves that version with another interface
                copy = sent.version
                self._refused[copy.name, copy.version] = copy.interface_digest
            self._forget(number)
            sink.fail(error)
            return
        if final:
            self._forget(number)
        sink.send(response, final)

    def _told(self, states: dict[str, dict[str, list[object]]]) -> None:
        self._states = states
        self.states_told += 1
        self._states_known.set()
        for (name, version), interface in list(self._refused.items()):
            told = states.get(name, {}).get(str(version))
            if told is None or told[3] == interface:
                del self._refused[name, version]

    def _forget(self, number: int) -> None:
        sent = self._sent.pop(number)
        sent.forget_cancel()
        sent.answered()

    def _fail(self, number: object, error: CoreserveError) -> None:
        if not isinstance(number, int) or number not in self._sent:
            return
        sent = self._sent[number]
        self._forget(number)
        if sent.request.sink is not None and not sent.request.sink.done:
            sent.request.sink.fail(error)

    def _fail_all(self, error: CoreserveError) -> None:
        for number in list(self._sent):
            self._fail(number, error)

    async def close(self) -> None:
        if self._keeping is not None:
            self._keeping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeping
        self._fail_all(UnavailableError("the server is stopping"))


def _states_of(header: dict[str, object]) -> dict[str, dict[str, list[object]]]:
    """Worker 0's states of its models, as a frame tells them (FrameError where they are not
    the shape `ForwardedRequests.states` gives)."""
    states = header["states"]
    if isinstance(states, dict) and all(
        isinstance(versions, dict)
        and all(isinstance(told, list) and len(told) == 4 for told in versions.values())
        for versions in states.values()
    ):
        return states
    raise FrameError("worker 0's states in a frame that cannot be read", MALFORMED)


class ForwardingScheduler(Scheduler):
    """A model version that worker 0 serves for every worker: requests are sent there (and are
    counted there: this scheduler queues and executes none, so its gauges read 0)."""

    answers_from_cache = False  # worker 0's cache answers, where the model has one

    def __init__(self, link: OwnerLink, version: ModelVersion) -> None:
        super().__init__(version.signature, version.statistics, [])
        self._link = link
        self._version = version
        self._since = link.states_told  # what worker 0 told before this load is of an older one
        self._sending = 0
        self._done_sending = asyncio.Event()

    def failure(self) -> str:
        return self._link.verdict(self._version, self._since)[0]

    def serving(self) -> bool:
        return self._link.verdict(self._version, self._since)[1]

    def start(self) -> None:
        self._done_sending.set()

    def submit(self, request: InferenceRequest, *, admitted: bool = False) -> None:
        self._check_takes(request, admitted)
        self._link.send(request, self._version, self._answered)
        request.queued_ns = now_ns()  # (sent on: refusals that come later are worker 0's model's)
        self._sending += 1
        self._done_sending.clear()

    def _answered(self) -> None:
        self._sending -= 1
        if not self._sending:
            self._done_sending.set()

    async def close(self, timeout: float | None = None) -> bool:
        """Stops sending; waits (at most `timeout` seconds) for the answers of those sent.
        Returns whether they all came in time."""
        self._closed = True
        if not self._sending:  # (a wait of 0 s times out even for an event that is set)
            return True
        try:
            await asyncio.wait_for(self._done_sending.wait(), timeout)
        except TimeoutError:
            return False
        return True
