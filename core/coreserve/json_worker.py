"""The worker process that parses large JSON request bodies for the HTTP frontend.

    python -m coreserve.json_worker FD SERVER_PID

Parsing a large JSON body holds the interpreter lock for seconds (`orjson.loads` is one C
call), in a thread as much as on the event loop: in a process of its own it holds up no other
client. The server sends a job (what to parse, and the body as a buffer of its own); this
process parses it with the same functions the server uses for small bodies, so that the arrays
and the errors are the same, and sends back the result, its arrays as raw buffers beside a
small pickle. One job at a time; the process ends when the server closes its end of the socket
(or dies: on Linux the kernel kills it then). Standard library, numpy and the protocol only.

A message, either way: `HEAD` (pickle length, buffer count), one 8-byte length per buffer,
the pickle, then the buffers.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import signal
import socket
import struct
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from coreserve.errors import CoreserveError
from coreserve.protocol.generate import parse_generate_document
from coreserve.protocol.http_body import parse_infer_document

HEAD = struct.Struct("<QI")
_LENGTH = struct.Struct("<Q")
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# What a job may ask for: each takes the body (the job's one buffer) and then the job's args.
PARSERS: dict[str, Callable[..., object]] = {
    "infer": parse_infer_document,
    "generate": parse_generate_document,
}


@dataclass(slots=True)
class Job:
    id: int
    kind: str  # a key of PARSERS
    args: tuple[Any, ...]


@dataclass(slots=True)
class Reply:
    """What a job gave: its result, or the client error it raised, or the fault that ended it."""

    id: int
    result: object = None
    error: CoreserveError | None = None
    fault: str | None = None  # a traceback: a bug, not the client's mistake
    rss_bytes: int = 0  # this process's resident memory after the job


def encode_message(message: object) -> list[bytes | memoryview]:
    """A message as the pieces to send: head and pickle, then the raw buffers of its arrays."""
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
    raws = [buffer.raw() for buffer in buffers]
    return [message_head(len(data), [raw.nbytes for raw in raws]) + data, *raws]


def message_head(pickle_length: int, buffer_lengths: Sequence[int]) -> bytes:
    return HEAD.pack(pickle_length, len(buffer_lengths)) + b"".join(
        _LENGTH.pack(length) for length in buffer_lengths
    )


def buffer_lengths(data: bytes | bytearray | memoryview, count: int) -> list[int]:
    return [_LENGTH.unpack_from(data, 8 * index)[0] for index in range(count)]


def _receive_exactly(connection: socket.socket, size: int) -> memoryview | None:
    view = np.empty(size, np.uint8).data  # its pages are touched as the data comes (no zeroing)
    received = 0
    while received < size:
        count = connection.recv_into(view[received:])
        if count == 0:
            return None
        received += count
    return view


def _receive_job(connection: socket.socket) -> tuple[Job, list[memoryview]] | None:
    head = _receive_exactly(connection, HEAD.size)
    if head is None:
        return None
    pickle_length, count = HEAD.unpack(head)
    lengths = _receive_exactly(connection, _LENGTH.size * count)
    data = _receive_exactly(connection, pickle_length) if lengths is not None else None
    if lengths is None or data is None:  # the server closed the socket mid-job
        return None
    buffers = [_receive_exactly(connection, length) for length in buffer_lengths(lengths, count)]
    if any(buffer is None for buffer in buffers):
        return None
    return pickle.loads(data), buffers  # type: ignore[return-value]  # None was ruled out above


def _run(job: Job, buffers: list[memoryview]) -> Reply:
    try:
        return Reply(job.id, result=PARSERS[job.kind](*buffers, *job.args))
    except CoreserveError as exc:
        return Reply(job.id, error=exc.with_traceback(None))
    except Exception as exc:  # a bug: the server logs it and answers 500
        return Reply(job.id, fault="".join(traceback.format_exception(exc)))


def resident_bytes() -> int:
    """This process's resident memory (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as file:
            return int(file.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _return_freed_memory() -> Callable[[], None]:
    """A call that hands the heap's free pages back to the system (glibc), or does nothing."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        trim = ctypes.CDLL(None).malloc_trim
        return lambda: trim(0)
    return lambda: None


def _die_with_server(server_pid: int) -> None:
    if sys.platform.startswith("linux"):
        with contextlib.suppress(ImportError, OSError, AttributeError):
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != server_pid:  # the server died before prctl ran
        os._exit(1)


def serve(connection: socket.socket) -> None:
    """Answers jobs until the server closes the socket."""
    trim = _return_freed_memory()
    while (received := _receive_job(connection)) is not None:
        job, buffers = received
        reply = _run(job, buffers)
        del buffers, received
        reply.rss_bytes = resident_bytes()
        for piece in encode_message(reply):
            connection.sendall(piece)
        del reply
        # A parsed document makes no reference cycles, so the collector stays off while it
        # is built (a large one would set it off again and again) and runs once it is gone.
        gc.collect()
        trim()


def main(argv: Sequence[str]) -> None:
    fd, server_pid = int(argv[0]), int(argv[1])
    _die_with_server(server_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server decides when this process ends
    gc.disable()
    connection = socket.socket(fileno=fd)
    with contextlib.suppress(ConnectionError):
        serve(connection)


if __name__ == "__main__":
    # Run as the module the server imports, so that the classes of the replies have its names.
    from coreserve.json_worker import main as run

    run(sys.argv[1:])
