"""Worker processes that parse large JSON request bodies beside the event loop.

`orjson.loads` of tens of megabytes holds the interpreter lock for its whole run, and so does
turning the millions of values it makes into arrays: on a worker thread as much as on the
loop, every other client (health probes included) waited that long (docs/benchmarks.md). A worker
process (`coreserve.json_worker`) does that part; the loop only moves bytes to it and back,
a socket read or write at a time. Each worker is started on the first large body that finds
no idle one, at most `processes` of them; they parse one body at a time each.

Everything is bounded: a body waits for a worker only while fewer than `max_waiting` wait
(then 503); a client that leaves while its body is parsed has its worker killed (the next body
starts a new one); a worker whose resident memory stays above `RECYCLE_RSS_BYTES` after a job
is replaced; one that dies fails its request with a clear error, and the next body starts a
new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import pickle
import signal
import socket
import sys
import threading
from collections.abc import Mapping

import numpy as np

from coreserve.config.signature import TensorSpec
from coreserve.errors import InternalError, UnavailableError
from coreserve.json_worker import HEAD, Job, Reply, buffer_lengths, message_head
from coreserve.protocol.generate import GenerateDocument
from coreserve.protocol.http_body import InferDocument

logger = logging.getLogger(__name__)

WORKER_FD = 3  # the descriptor a worker finds its socket on (0-2 stay the server's stdio)
# After a large document the heap may keep pages it cannot hand back; past this, the worker
# is replaced rather than kept with them.
RECYCLE_RSS_BYTES = 256 << 20
# Bodies that may wait for a busy worker; each holds up to --http-max-input-size meanwhile.
MAX_WAITING = 8
# How long to wait for the exit status of a worker that broke off, for the error message.
EXIT_STATUS_WAIT_S = 1.0


def default_processes() -> int:
    """One worker per four cores, from one to four: the loop and the models need the rest."""
    return max(1, min(4, (os.cpu_count() or 1) // 4))


class JsonWorkers:
    """Parses large JSON bodies in worker processes, started when first needed."""

    def __init__(
        self,
        processes: int | None = None,
        max_waiting: int = MAX_WAITING,
        recycle_rss_bytes: int = RECYCLE_RSS_BYTES,
    ) -> None:
        self._processes = processes or default_processes()
        self._max_waiting = max_waiting
        self._recycle_rss_bytes = recycle_rss_bytes
        self._slots = asyncio.Semaphore(self._processes)
        self._waiting = 0
        self._idle: list[_Worker] = []
        self._workers: set[_Worker] = set()
        self._job_ids = itertools.count()
        self._closed = False

    @property
    def pids(self) -> list[int]:
        """The worker processes' ids (for diagnostics and tests)."""
        return [worker.pid for worker in self._workers]

    async def parse_infer(self, header: memoryview, binary_size: int, model_name: str) -> InferDocument:
        """`parse_infer_document` in a worker."""
        result = await self._run("infer", header, (binary_size, model_name))
        assert isinstance(result, InferDocument)
        return result

    async def parse_generate(
        self, body: bytes | bytearray, specs: Mapping[str, TensorSpec], batching: bool
    ) -> GenerateDocument:
        """`parse_generate_document` in a worker."""
        result = await self._run("generate", memoryview(body), (dict(specs), batching))
        assert isinstance(result, GenerateDocument)
        return result

    def close(self) -> None:
        """Ends every worker (one still parsing is killed)."""
        self._closed = True
        for worker in list(self._workers):
            worker.kill()
        self._workers.clear()
        self._idle.clear()

    async def _run(self, kind: str, body: memoryview, args: tuple[object, ...]) -> object:
        if self._slots.locked() and self._waiting >= self._max_waiting:
            raise UnavailableError(
                f"too many large JSON request bodies are waiting to be parsed ({self._max_waiting}); "
                "try again, or send the tensors as binary data (Inference-Header-Content-Length)"
            )
        self._waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
        try:
            reply = await self._run_in_worker(Job(next(self._job_ids), kind, args), body)
        finally:
            self._slots.release()
        if reply.fault is not None:
            logger.error("Parsing a JSON request body failed in the worker process:\n%s", reply.fault)
            raise InternalError("parsing the request body failed")
        if reply.error is not None:
            raise reply.error
        return reply.result

    async def _run_in_worker(self, job: Job, body: memoryview) -> Reply:
        if self._closed:
            raise UnavailableError("the server is stopping")
        worker = self._idle_worker() or self._start_worker()
        try:
            reply = await worker.run(job, body)
        except BaseException:  # the client left (cancelled), or the worker broke off
            worker.kill()  # it may be mid-message: it is not used again
            self._workers.discard(worker)
            raise
        if reply.rss_bytes > self._recycle_rss_bytes or self._closed:
            logger.debug("Replacing the JSON worker process (%d MiB resident)", reply.rss_bytes >> 20)
            worker.close()
            self._workers.discard(worker)
        else:
            self._idle.append(worker)
        return reply

    def _idle_worker(self) -> _Worker | None:
        while self._idle:
            worker = self._idle.pop()
            if worker.alive:
                return worker
            self._workers.discard(worker)  # it died while idle (the OOM killer, say)
        return None

    def _start_worker(self) -> _Worker:
        worker = _Worker.start()
        self._workers.add(worker)
        return worker


class _Worker:
    """One worker process and the server's end of its socket."""

    def __init__(self, pid: int, connection: socket.socket, exited: asyncio.Future[int | None]) -> None:
        self.pid = pid
        self._socket = connection
        self._exited = exited

    @classmethod
    def start(cls) -> _Worker:
        """Spawns a worker (on the event loop's thread, which lives as long as the server)."""
        ours, theirs = socket.socketpair()
        try:
            pid = _spawn(theirs)
        except OSError as exc:
            ours.close()
            raise UnavailableError(f"cannot start a process to parse the JSON request body: {exc}") from None
        finally:
            theirs.close()
        ours.setblocking(False)
        return cls(pid, ours, _watch_exit(pid, asyncio.get_running_loop()))

    @property
    def alive(self) -> bool:
        return not self._exited.done()

    async def run(self, job: Job, body: memoryview) -> Reply:
        """Sends `job` with `body` as its buffer and returns the worker's reply."""
        loop = asyncio.get_running_loop()
        data = pickle.dumps(job, protocol=5)
        try:
            await loop.sock_sendall(self._socket, message_head(len(data), [body.nbytes]) + data)
            await loop.sock_sendall(self._socket, body)
            pickle_length, count = HEAD.unpack(await self._receive(HEAD.size))
            lengths = buffer_lengths(await self._receive(8 * count), count)
            pickled = await self._receive(pickle_length)
            buffers = [await self._receive(length) for length in lengths]
        except (ConnectionError, EOFError):
            raise InternalError(
                f"the process parsing the request body exited {await self._exit_status()} before it answered"
            ) from None
        reply = pickle.loads(pickled, buffers=buffers)
        if not isinstance(reply, Reply) or reply.id != job.id:
            raise InternalError("the process parsing the request body answered another request")
        return reply

    async def _receive(self, size: int) -> memoryview:
        loop = asyncio.get_running_loop()
        # The arrays of the reply are made over these buffers, not copied. Unlike a bytearray
        # (zeroed all at once, holding the loop), np.empty's pages are touched as the data arrives.
        view = np.empty(size, np.uint8).data
        received = 0
        while received < size:
            count = await loop.sock_recv_into(self._socket, view[received:])
            if count == 0:
                raise EOFError
            received += count
        return view

    async def _exit_status(self) -> str:
        with contextlib.suppress(TimeoutError):
            code = await asyncio.wait_for(asyncio.shield(self._exited), EXIT_STATUS_WAIT_S)
            if code is not None and code < 0:
                with contextlib.suppress(ValueError):
                    return f"(killed by {signal.Signals(-code).name})"
            return f"(with code {code})"
        return "(its exit status is unknown)"

    def close(self) -> None:
        """Closes the socket: the worker exits once it reads the end."""
        self._socket.close()

    def kill(self) -> None:
        self._socket.close()
        if self.alive:  # not yet reaped, so the pid is still this worker's
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


def _spawn(their_end: socket.socket) -> int:
    """Starts a worker with `their_end` as descriptor WORKER_FD; returns its pid.

    posix_spawn, not fork: a fork of a process with grpc's threads runs their fork handlers,
    which may abort the server (see coreserve_python.server._spawn).
    """
    source = their_end.fileno()
    spare = os.dup(source) if source == WORKER_FD else None  # dup2 onto itself keeps close-on-exec
    try:
        argv = [sys.executable, "-m", "coreserve.json_worker", str(WORKER_FD), str(os.getpid())]
        return os.posix_spawn(
            sys.executable,
            argv,
            os.environ,
            file_actions=[(os.POSIX_SPAWN_DUP2, spare if spare is not None else source, WORKER_FD)],
            setsid=True,  # a terminal's Ctrl-C is the server's to handle
            setsigmask=(),
            setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),  # as subprocess restores them
        )
    finally:
        if spare is not None:
            os.close(spare)


def _watch_exit(pid: int, loop: asyncio.AbstractEventLoop) -> asyncio.Future[int | None]:
    """A future that gets the exit code of worker `pid` (minus the signal that killed it) once
    it is reaped; a thread waits for it."""
    exited: asyncio.Future[int | None] = loop.create_future()

    def deliver(code: int | None) -> None:
        if not exited.done():
            exited.set_result(code)

    def wait() -> None:
        try:
            code: int | None = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        except ChildProcessError:
            code = None
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(deliver, code)

    threading.Thread(target=wait, name=f"coreserve-json-worker-{pid}", daemon=True).start()
    return exited
