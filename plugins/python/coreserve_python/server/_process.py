"""Starting, talking to and stopping stub processes (server side).

Descriptors have one owner each: the server's end of a socket pair belongs to the asyncio
transport once the connection is made (or to the `Channel`, for one-shot stubs) and is closed
by it alone; the stub's end is closed here right after the spawn, whether the spawn worked or
not. See `_spawn` for how a stub is started and reaped.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import pickle
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from coreserve import CoreserveError, InternalError, UnavailableError
from coreserve_python.ipc import (
    FRAME_LENGTH,
    NONE_STARTED,
    RECEIVE_CHUNK,
    SHM_DIR,
    STUB_OWNER,
    Channel,
    FinalizeMessage,
    Message,
    StartMark,
    encode_frame,
    segment_prefix,
)
from coreserve_python.server._spawn import STUB_FD, describe_exit, kill, reap_blocking, spawn_stub, watch_exit

logger = logging.getLogger("coreserve.backend.python")

LOG_LEVELS = {
    "INFO": logging.INFO,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
    "VERBOSE": logging.DEBUG,
}
FINALIZE_TIMEOUT_S = 30.0
# How long a stub may take to exit after its socket closed, before it is killed.
EXIT_GRACE_S = 5.0


def log_model_line(message: Message) -> None:
    """Writes a `log` message of a stub, as Triton writes a model's line: named by the model's file
    and line only (`model.py:35] "text"`; a line of the stub's own is named by this call's)."""
    level = LOG_LEVELS.get(message["level"], logging.INFO)
    logger.log(level, "%s", message["message"], extra={"source": message.get("source", "")})


class StubLaunch:
    """How to start a stub: which Python, with which environment."""

    def __init__(self, python: str, env: dict[str, str] | None = None) -> None:
        self.python = python
        self.env = env

    def command(self) -> list[str]:
        # The stub checks that the server's pid is its parent's, to die with it.
        return [self.python, "-m", "coreserve_python.stub", str(STUB_FD), str(os.getpid())]

    def spawn(self, their_end: socket.socket) -> int:
        """Starts a stub on `their_end`, then closes it here; returns the stub's pid."""
        try:
            return spawn_stub(self.python, self.command(), self.env, their_end)
        except OSError as exc:
            raise UnavailableError(f"cannot start the Python stub ({self.python}): {exc}") from None
        finally:
            their_end.close()


def run_once(launch: StubLaunch, message: Mapping[str, Any], reply_op: str, timeout: float) -> Message:
    """Starts a stub, sends one message, returns its reply and stops the stub (blocking)."""
    ours, theirs = socket.socketpair()
    try:
        pid = launch.spawn(theirs)
    except BaseException:
        ours.close()
        raise
    ours.settimeout(timeout)
    channel = Channel(ours)
    reaped = False
    try:
        channel.send(message)
        while (reply := channel.receive()) is not None and reply["op"] != reply_op:
            if reply["op"] == "log":
                log_model_line(reply)
        if reply is None:
            code = reap_blocking(pid, timeout)
            reaped = True
            raise InternalError(f"the Python stub exited {describe_exit(code)} before answering")
        channel.send({"op": "finalize"})
        return reply
    except TimeoutError:
        raise UnavailableError(f"the Python stub did not answer within {timeout} s") from None
    finally:
        channel.close()
        if not reaped:
            reap_blocking(pid, timeout)
        remove_segments_of(pid)


class StubProcess:
    """A running stub and the server's end of its socket (asyncio)."""

    def __init__(
        self,
        launch: StubLaunch,
        name: str,
        on_message: Callable[[Message], None],
        on_exit: Callable[[StubProcess, int | None], None],
    ) -> None:
        self._launch = launch
        self.name = name
        self._on_message = on_message
        self._on_exit = on_exit
        self.pid: int | None = None
        self.fileno = -1  # the server's end of the socket, once started
        self._exit: asyncio.Future[int | None] | None = None
        self._writer: asyncio.Transport | None = None
        self._reader_task: asyncio.Task[None] | None = None
        # Replies awaited, by the id of the message they answer (several may wait at once).
        self._replies: dict[int, tuple[str, asyncio.Future[Message], Callable[[Message], None] | None]] = {}
        self._message_ids = itertools.count()
        self._stopping = False
        self._start_mark: StartMark | None = None
        # Once the stub has exited: the key of the last request it started (see ipc/_start_mark.py),
        # and its exit code.
        self.last_started_key = NONE_STARTED
        self.exit_code: int | None = None

    @property
    def alive(self) -> bool:
        return self._exit is not None and not self._exit.done() and not self._stopping

    async def start(self) -> None:
        """Spawns the stub (on the event loop's thread, which lives as long as the server)."""
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        try:
            self.pid = self._launch.spawn(theirs)
        except BaseException:
            ours.close()
            raise
        self._exit = watch_exit(self.pid, loop)
        connection = StubConnection(self._dispatch)
        try:
            # Named as the stub's segments are: removed with them once the stub has exited.
            self._start_mark = StartMark(SHM_DIR / f"coreserve-stub-{self.pid}-started")
            self._writer, _ = await loop.create_unix_connection(lambda: connection, sock=ours)
        except BaseException:
            ours.close()  # a no-op if the transport took it: it detaches the socket when it closes
            await self._kill_and_reap()
            self._close_start_mark()
            raise
        self._reader_task = asyncio.create_task(self._read(connection), name=f"{self.name}:stub-reader")
        self.fileno = ours.fileno()

    def started_up_to(self) -> int:
        """The key of the last request the stub started, read now (NONE_STARTED before its first)."""
        return self._start_mark.last_started() if self._start_mark is not None else self.last_started_key

    @property
    def start_mark_path(self) -> str:
        """Where the stub maps its start mark (the init message says it); see ipc/_start_mark.py."""
        assert self._start_mark is not None
        return str(self._start_mark.path)

    def unlink_start_mark(self) -> None:
        """Removes the mark's file once the stub has mapped it (or failed to start)."""
        if self._start_mark is not None:
            self._start_mark.unlink()

    def send(self, message: Mapping[str, Any]) -> None:
        if self._writer is None or self._writer.is_closing():
            raise InternalError(f"the Python stub of {self.name} is not running")
        self._writer.write(encode_frame(message))

    async def request(
        self,
        message: Mapping[str, Any],
        reply_op: str,
        timeout: float | None = None,
        after_send: Callable[[], None] | None = None,
        on_reply: Callable[[Message], None] | None = None,
    ) -> Message:
        """Sends a message and waits for the stub's reply of kind `reply_op` to it (by id);
        `after_send` is called once the message is all written (see _reply_spin.py), and
        `on_reply` with the reply as soon as it is read, before this wakes (it must not raise)."""
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        message_id = next(self._message_ids)
        self._replies[message_id] = (reply_op, future, on_reply)
        try:
            self.send({**message, "id": message_id})
            # Not while part of it waits in the transport's buffer: the loop writes that.
            buffered = self._writer is not None and self._writer.get_write_buffer_size()
            if after_send is not None and not buffered:
                after_send()
            # (wait_for costs a coroutine and a timer: not paid for the executions' untimed waits)
            return await (future if timeout is None else asyncio.wait_for(future, timeout))
        finally:
            self._replies.pop(message_id, None)

    def _dispatch(self, message: Message) -> None:
        """Hands a message of the stub to whoever waits for it (by id), or to `on_message`."""
        waiting = self._replies.pop(message.get("reply_to", -1), None)
        if waiting is None:
            self._on_message(message)
        elif waiting[0] != message["op"]:
            raise InternalError(f"the stub answered with '{message['op']}' where '{waiting[0]}' was due")
        elif not waiting[1].done():
            if waiting[2] is not None:
                waiting[2](message)
            waiting[1].set_result(message)

    async def _read(self, connection: StubConnection) -> None:
        """Waits for the end of the stub's socket, then for the stub's exit, and reports it."""
        if await connection.ended is not None:
            # A message we cannot read (or handle) leaves the stub's state unknown: replace it.
            logger.error(
                "the Python stub of %s sent a message the server cannot handle",
                self.name,
                exc_info=connection.ended.result(),
            )
        if self._writer is not None:
            self._writer.close()  # a stub still running takes this as the end (see stub/_stub.py)
        code = self.exit_code = await self._wait_exit(EXIT_GRACE_S)
        self._close_start_mark()
        if self.pid is not None:
            remove_segments_of(self.pid)
        error = InternalError(f"the Python stub of {self.name} exited {describe_exit(code)}")
        for _, future, _ in self._replies.values():
            if not future.done():
                future.set_exception(error)
        self._replies.clear()
        if not self._stopping:
            self._on_exit(self, code)

    async def _wait_exit(self, timeout: float) -> int | None:
        """The stub's exit code; kills it if it has not exited within `timeout` s."""
        assert self._exit is not None
        try:
            return await asyncio.wait_for(asyncio.shield(self._exit), timeout)
        except TimeoutError:
            await self._kill_and_reap()
            return self._exit.result() if self._exit.done() else None

    async def _kill_and_reap(self) -> None:
        if self._exit is None or self.pid is None:
            return
        if not self._exit.done():
            kill(self.pid)
            # SIGKILL cannot be caught: the exit follows at once (unless the kernel is stuck).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._exit), EXIT_GRACE_S)

    async def stop(self, timeout: float = FINALIZE_TIMEOUT_S) -> Message | None:
        """Asks the model to finalize, then ends the process; returns the finalize reply.

        A stub that does not finalize within `timeout` s, or that is still running when this
        is cancelled (the server's exit timeout ran out), is killed; either way it is reaped
        before this returns.
        """
        reply = None
        running = self.alive
        self._stopping = True  # from now on the stub's exit is expected
        try:
            if running:
                try:
                    finalize: FinalizeMessage = {"op": "finalize"}
                    reply = await self.request(finalize, "finalize_done", timeout)
                except (TimeoutError, CoreserveError):
                    logger.warning("the Python stub of %s did not finalize within %.0f s", self.name, timeout)
            if self._writer is not None:
                self._writer.close()  # the stub exits when its socket closes
            if self._exit is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(self._exit), EXIT_GRACE_S)
        finally:
            await self.kill()
        return reply

    async def kill(self) -> None:
        """Ends the stub now (SIGKILL unless it has exited) and reaps it; no finalize()."""
        self._stopping = True
        if self._writer is not None:
            self._writer.close()
        await self._kill_and_reap()
        if self._reader_task is not None and not self._reader_task.done():
            self._reader_task.cancel()
            await asyncio.wait([self._reader_task])
        if self._exit is not None and self._exit.done():
            self._close_start_mark()
            if self.pid is not None:
                remove_segments_of(self.pid)

    def _close_start_mark(self) -> None:
        """Reads the stub's start mark for the last time (it has exited) and lets it go."""
        if self._start_mark is not None:
            self.last_started_key = self._start_mark.last_started()
            self._start_mark.close()
            self._start_mark = None


class StubConnection(asyncio.Protocol):
    """The server's end of a stub's socket: cuts what arrives into messages as it arrives.

    Each message is handled from the event loop's callback for the bytes that carry it (no
    reader task woken per message, as a StreamReader would need). `ended` resolves when the
    socket closes: to None, or to the exception that a message which cannot be read or handled
    raised (the socket is then closed).
    """

    def __init__(self, handle: Callable[[Message], None]) -> None:
        self._handle = handle
        self._pending = bytearray()
        self._needed = 0  # the bytes the pending message takes in all (see data_received)
        self._transport: asyncio.BaseTransport | None = None
        self.ended: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        if self._pending:  # the rest of a message that came in pieces
            self._pending += data
            if len(self._pending) < self._needed:
                return  # (copied once it is whole: a large message comes in many pieces)
            data = bytes(self._pending)
            self._pending.clear()
        view = memoryview(data)
        offset = 0
        needed = FRAME_LENGTH.size
        try:
            while len(data) - offset >= FRAME_LENGTH.size:
                end = offset + FRAME_LENGTH.size + FRAME_LENGTH.unpack_from(data, offset)[0]
                if end > len(data):
                    needed = end - offset
                    break
                message = pickle.loads(view[offset + FRAME_LENGTH.size : end])
                offset = end
                self._handle(message)
        except Exception as exc:
            self._end(exc)
            return
        self._pending += view[offset:]
        self._needed = needed  # what the next message takes, its length included

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            self._drain()
        self._end(None)  # (a reset: the stub went away, as surely as with an orderly close)

    def _drain(self) -> None:
        """Handles what the stub sent before it died, where the server has not read it yet.

        A write to a stub that has died (the next execution, handed ahead) fails, and asyncio
        then closes the socket without reading what is left in it: the replies the stub sent
        for the executions it finished before it died, which must not be lost with it.
        """
        if self._transport is None:
            return
        sock = self._transport.get_extra_info("socket")
        if sock is None:
            return
        while not self.ended.done():
            try:
                data = os.read(sock.fileno(), RECEIVE_CHUNK)  # (non-blocking: asyncio's socket)
            except OSError:  # nothing more (BlockingIOError), or the reset once it is all read
                return
            if not data:
                return
            self.data_received(data)

    def _end(self, error: BaseException | None) -> None:
        if not self.ended.done():
            self.ended.set_result(error)
        if self._transport is not None:
            self._transport.close()


def remove_segments_of(pid: int) -> None:
    """Removes the shared memory files a stub that has exited left behind (after a crash)."""
    for path in SHM_DIR.glob(f"{segment_prefix(STUB_OWNER, pid)}-*"):
        path.unlink(missing_ok=True)


def stub_environment(*paths: Path) -> dict[str, str] | None:
    """The environment of a stub: this one, with PYTHONPATH set to `paths` if any are given."""
    if not paths:
        return None
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(str(path) for path in paths)
    return env
