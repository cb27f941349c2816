"""Starting, talking to and stopping stub processes (server side)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path

from coreserve import InternalError, UnavailableError
from coreserve_python.wire import SHM_DIR, Channel, Message, decode_frame, encode_frame

logger = logging.getLogger("coreserve.backend.python")
_LENGTH = struct.Struct("<I")


class StubLaunch:
    """How to start a stub: which Python, with which environment."""

    def __init__(self, python: str, env: dict[str, str] | None = None) -> None:
        self.python = python
        self.env = env

    def command(self, fd: int) -> list[str]:
        return [self.python, "-m", "coreserve_python.stub", str(fd)]


def run_once(launch: StubLaunch, message: Message, reply_op: str, timeout: float) -> Message:
    """Starts a stub, sends one message, returns its reply and stops the stub (blocking)."""
    ours, theirs = socket.socketpair()
    process = subprocess.Popen(
        launch.command(theirs.fileno()), pass_fds=[theirs.fileno()], env=launch.env, start_new_session=True
    )
    theirs.close()
    ours.settimeout(timeout)
    channel = Channel(ours)
    try:
        channel.send(message)
        while (reply := channel.receive()) is not None and reply["op"] != reply_op:
            if reply["op"] == "log":
                logger.info("%s", reply["message"])
        if reply is None:
            raise InternalError(f"the Python stub exited with code {process.wait(timeout)} before answering")
        channel.send({"op": "finalize"})
        return reply
    except TimeoutError:
        raise UnavailableError(f"the Python stub did not answer within {timeout} s") from None
    finally:
        channel.close()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class StubProcess:
    """A running stub and the server's end of its socket (asyncio)."""

    def __init__(
        self,
        launch: StubLaunch,
        name: str,
        on_message: Callable[[Message], None],
        on_exit: Callable[[int | None], None],
    ) -> None:
        self._launch = launch
        self.name = name
        self._on_message = on_message
        self._on_exit = on_exit
        self._process: asyncio.subprocess.Process | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._replies: dict[str, asyncio.Future[Message]] = {}
        self._stopping = False

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.returncode is None and not self._stopping

    async def start(self) -> None:
        ours, theirs = socket.socketpair()
        # A session of its own: a terminal's Ctrl-C reaches the server, which then finalizes
        # the model; the stub must not die of it first.
        self._process = await asyncio.create_subprocess_exec(
            *self._launch.command(theirs.fileno()),
            pass_fds=[theirs.fileno()],
            env=self._launch.env,
            start_new_session=True,
        )
        theirs.close()
        reader, self._writer = await asyncio.open_unix_connection(sock=ours)
        self._reader_task = asyncio.create_task(self._read(reader), name=f"{self.name}:stub-reader")

    def send(self, message: Message) -> None:
        if self._writer is None or self._writer.is_closing():
            raise InternalError(f"the Python stub of {self.name} is not running")
        self._writer.write(encode_frame(message))

    async def request(self, message: Message, reply_op: str, timeout: float | None = None) -> Message:
        """Sends a message and waits for the stub's reply of kind `reply_op`."""
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._replies[reply_op] = future
        self.send(message)
        return await asyncio.wait_for(future, timeout)

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                header = await reader.readexactly(_LENGTH.size)
                message = decode_frame(await reader.readexactly(_LENGTH.unpack(header)[0]))
                future = self._replies.pop(message["op"], None)
                if future is not None:
                    if not future.done():
                        future.set_result(message)
                else:
                    self._on_message(message)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        code = await self._process.wait() if self._process is not None else None
        if self._process is not None:
            remove_segments_of(self._process.pid)
        error = InternalError(f"the Python stub of {self.name} exited (code {code})")
        for future in self._replies.values():
            if not future.done():
                future.set_exception(error)
        self._replies.clear()
        if not self._stopping:
            self._on_exit(code)

    async def stop(self, timeout: float = 30.0) -> Message | None:
        """Asks the model to finalize, then ends the process; returns the finalize reply."""
        reply = None
        running = self.alive
        self._stopping = True  # from now on the stub's exit is expected
        if running:
            try:
                reply = await self.request({"op": "finalize"}, "finalize_done", timeout)
            except (TimeoutError, InternalError):
                logger.warning("the Python stub of %s did not finalize within %.0f s", self.name, timeout)
        if self._writer is not None:
            self._writer.close()
        if self._process is not None and self._process.returncode is None:
            try:
                await asyncio.wait_for(self._process.wait(), timeout)
            except TimeoutError:
                self._process.kill()
                await self._process.wait()
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader_task
        return reply

    def kill(self) -> None:
        if self._process is not None and self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()


def remove_segments_of(pid: int) -> None:
    """Removes the shared memory files a stub that has exited left behind (after a crash)."""
    for path in SHM_DIR.glob(f"coreserve-stub-{pid}-*"):
        path.unlink(missing_ok=True)


def stub_environment(extra_path: Path | None) -> dict[str, str] | None:
    """The environment of a stub: this one, with `extra_path` first on PYTHONPATH if given."""
    if extra_path is None:
        return None
    env = dict(os.environ)
    env["PYTHONPATH"] = str(extra_path)
    return env
