"""Starting stub processes safely beside the server's threads, and reaping them.

The server runs grpc's threads (and the HTTP event loop, and executor threads). A plain fork()
of such a process runs every pthread_atfork handler — grpc's refuse to run while other threads
are inside gRPC ("skipping fork() handlers") and the server can abort — and runs Python code
in a child that holds copies of locks held by other threads. `os.posix_spawn` is implemented
by glibc with clone(CLONE_VM | CLONE_VFORK) followed at once by exec: no fork handlers, no
Python in the child. The child gets exactly one extra descriptor (its end of the socket pair,
as `STUB_FD`), through a dup2 file action that only the child performs.

Each spawned pid is reaped exactly once, by `watch_exit` (a pidfd on the event loop, or a
waiting thread where pidfds are missing) or by `reap_blocking`; a pid is only signalled while
it is known not to have been reaped, so a reused pid is never hit.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import threading
import time

# The descriptor number a stub finds its socket on (0-2 stay the server's stdio).
STUB_FD = 3


def spawn_stub(python: str, argv: list[str], env: dict[str, str] | None, their_end: socket.socket) -> int:
    """Starts `argv` with `their_end` as descriptor `STUB_FD` in a session of its own; returns the pid.

    Call it from the event loop's thread (or a thread that outlives the stub): a stub asks the
    kernel to kill it when the thread that spawned it dies.
    """
    source = their_end.fileno()
    spare = None
    if source == STUB_FD:
        # dup2 onto itself would keep close-on-exec set: hand the child a copy instead.
        spare = os.dup(source)
        source = spare
    try:
        return os.posix_spawn(
            python,
            argv,
            env if env is not None else os.environ,
            file_actions=[(os.POSIX_SPAWN_DUP2, source, STUB_FD)],
            # A session of its own: a terminal's Ctrl-C reaches the server, which then
            # finalizes the model; the stub must not die of it first.
            setsid=True,
            setsigmask=(),
            # As subprocess's restore_signals: Python ignores these, exec would keep that.
            setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
        )
    finally:
        if spare is not None:
            os.close(spare)


def exit_code(status: int) -> int:
    """A wait status as subprocess reports it: the exit code, or minus the killing signal."""
    return os.waitstatus_to_exitcode(status)


def describe_exit(code: int | None) -> str:
    if code is None:
        return "with an unknown status"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"with code {code}"


def watch_exit(pid: int, loop: asyncio.AbstractEventLoop) -> asyncio.Future[int | None]:
    """A future that gets the exit code of child `pid` once it has exited and been reaped."""
    future: asyncio.Future[int | None] = loop.create_future()
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        thread = threading.Thread(
            target=_wait_in_thread, args=(pid, loop, future), name=f"coreserve-reap-{pid}", daemon=True
        )
        thread.start()
        return future

    def readable() -> None:
        try:
            reaped, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # reaped by someone else: the code is lost
            reaped, status = pid, -1
        if reaped == 0:
            return
        loop.remove_reader(pidfd)
        os.close(pidfd)
        if not future.done():
            future.set_result(exit_code(status) if status != -1 else None)

    loop.add_reader(pidfd, readable)
    return future


def _wait_in_thread(pid: int, loop: asyncio.AbstractEventLoop, future: asyncio.Future[int | None]) -> None:
    try:
        code: int | None = exit_code(os.waitpid(pid, 0)[1])
    except ChildProcessError:
        code = None

    def deliver() -> None:
        if not future.done():
            future.set_result(code)

    with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
        loop.call_soon_threadsafe(deliver)


def kill(pid: int) -> None:
    """Sends SIGKILL to a child that has not been reaped yet, and to the processes the model
    forked in it (its process group: a stub leads its own session, see `spawn_stub`)."""
    with contextlib.suppress(ProcessLookupError):
        if os.getpgid(pid) == pid:  # (unreaped, its pid is its group's for sure)
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)


def reap_blocking(pid: int, timeout: float) -> int | None:
    """Waits up to `timeout` s for child `pid` to exit, kills it if it has not, and reaps it."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    try:
        while True:
            reaped, status = os.waitpid(pid, os.WNOHANG)
            if reaped:
                return exit_code(status)
            if time.monotonic() >= deadline:
                kill(pid)
                return exit_code(os.waitpid(pid, 0)[1])
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
    except ChildProcessError:
        return None
