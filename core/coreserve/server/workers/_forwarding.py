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
from collections.abc import Callable
from dataclasses import dataclass

from coreserve.errors import CancelledError, CoreserveError, InvalidArgumentError, UnavailableError
from coreserve.repository.model import ModelVersion
from coreserve.scheduling import Scheduler
from coreserve.server.workers._channel import error_from
from coreserve.server.workers._frames import (
    Frame,
    Pieces,
    entries_frame,
    frame,
    read_frame,
    request_frame,
    response_from,
)
from coreserve.types import InferenceRequest

logger = logging.getLogger(__name__)

RECONNECT_DELAY_S = 0.2


@dataclass
class _Sent:
    request: InferenceRequest
    forget_cancel: Callable[[], None]
    answered: Callable[[], None]  # its scheduler's count of requests out


class OwnerLink:
    """This worker's line to worker 0, shared by every model that worker 0 serves for all."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._writer: asyncio.StreamWriter | None = None
        self._sent: dict[int, _Sent] = {}
        self._next = 0
        # Worker 0's states of its single-copy models (None until it told them on this line).
        self._states: dict[str, dict[str, str]] | None = None
        self._keeping: asyncio.Task[None] | None = None
        self._told = asyncio.Event()  # set while worker 0's states are known here
        self._ever_told = False

    async def start(self) -> None:
        """Connects, and returns once worker 0 has told its models' states (it listens once it
        has loaded its models); connects again each time the line breaks."""
        self._keeping = asyncio.create_task(self._keep_connected())
        await self._told.wait()

    def scheduler_for(self, version: ModelVersion) -> ForwardingScheduler:
        return ForwardingScheduler(self, version)

    def failure(self, name: str, version: int) -> str:
        """Why worker 0 does not serve that model version now ("" while it does, or while it
        does not know the model: a request then loads it there on demand or fails there).
        Before the line first connects (this worker starts; it joins once it has), nothing
        is known yet, and nothing is said."""
        if self._states is None:
            if not self._ever_told:
                return ""
            return f"worker 0, which serves model '{name}' for every worker, is not reachable"
        return self._states.get(name, {}).get(str(version), "")

    def send(self, request: InferenceRequest, version: int, answered: Callable[[], None]) -> None:
        """Sends `request` for model version `version`; `answered()` runs once it is answered
        (or failed)."""
        if self._writer is None or self._writer.is_closing():
            raise UnavailableError(
                f"worker 0, which serves model '{request.model_name}' for every worker, is not reachable"
            )
        self._next += 1
        number = self._next
        self._sent[number] = _Sent(request, request.on_cancel(lambda: self._cancel(number)), answered)
        self._writer.writelines(request_frame(number, request, version))

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
            self._writer = writer
            try:
                await self._read(reader)
            finally:
                self._writer = None
                self._states = None
                self._told.clear()
                writer.close()
                self._fail_all(UnavailableError("worker 0 stopped before it answered"))
            await asyncio.sleep(RECONNECT_DELAY_S)

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while (received := await read_frame(reader)) is not None:
                self._received(received)
        except (ConnectionError, InvalidArgumentError) as exc:
            logger.warning("the line to worker 0 broke: %s", exc)

    def _received(self, received: Frame) -> None:
        header = received.header
        if "states" in header:
            self._states = header["states"]
            self._told.set()
            self._ever_told = True
            return
        number = header["n"]
        sent = self._sent.get(number)
        if sent is None:
            return  # a cancelled request's late answer
        sink = sent.request.sink
        assert sink is not None
        if "error" in header:
            self._forget(number)
            sink.fail(error_from(header["error"]))
            return
        final = bool(header["final"])
        if final:
            self._forget(number)
        sink.send(response_from(received, sent.request.model_name), final)

    def _forget(self, number: int) -> None:
        sent = self._sent.pop(number)
        sent.forget_cancel()
        sent.answered()

    def _fail_all(self, error: CoreserveError) -> None:
        for number in list(self._sent):
            sink = self._sent[number].request.sink
            self._forget(number)
            if sink is not None and not sink.done:
                sink.fail(error)

    async def close(self) -> None:
        if self._keeping is not None:
            self._keeping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeping
        self._fail_all(UnavailableError("the server is stopping"))


class _OwnerState:
    """The forwarding scheduler's one instance: it runs nothing; it says whether worker 0
    serves the model version (`ModelVersion.instance_failure` reads `failure`)."""

    def __init__(self, link: OwnerLink, name: str, version: int) -> None:
        self._link = link
        self._name = name
        self._version = version

    @property
    def failure(self) -> str:
        return self._link.failure(self._name, self._version)

    async def close(self) -> None:
        return None


class ForwardingScheduler(Scheduler):
    """A model version that worker 0 serves for every worker: requests are sent there."""

    answers_from_cache = False  # worker 0's cache answers, where the model has one

    def __init__(self, link: OwnerLink, version: ModelVersion) -> None:
        state = _OwnerState(link, version.name, version.version)
        super().__init__(version.signature, version.statistics, [state])  # type: ignore[list-item]
        self._link = link
        self._version = version.version
        self._sending = 0
        self._done_sending = asyncio.Event()

    @property
    def pending(self) -> int:
        return 0  # counted where they run, in worker 0

    def start(self) -> None:
        self._done_sending.set()

    def submit(self, request: InferenceRequest) -> None:
        if self._closed:
            raise self._unloading()
        if request.is_cancelled():  # its client gave up while it was being decoded
            raise CancelledError.of_request(request.model_name)
        self._link.send(request, self._version, self._answered)
        self._sending += 1
        self._done_sending.clear()

    def _answered(self) -> None:
        self._sending -= 1
        if not self._sending:
            self._done_sending.set()

    async def close(self, timeout: float | None = None) -> None:
        """Stops sending; waits (at most `timeout` seconds) for the answers of those sent."""
        self._closed = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._done_sending.wait(), timeout)
