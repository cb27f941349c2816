"""Compressed gRPC messages (grpc-encoding gzip or deflate), inflated without holding up the loop.

A few hundred kilobytes of gzip can inflate to hundreds of megabytes, so a message is inflated
by its call's handler task, not by the connection's read: its first slice on the event loop
(a small message is done there), the rest on one of two threads of its own, where zlib lets go
of the interpreter lock (so bombs wait for each other, not the server's other work), and only
while its call is still wanted. A stream cut short or followed by other bytes is INTERNAL, as grpc's core
answers; one past the message size limit is RESOURCE_EXHAUSTED, found without inflating more
than one byte past the limit.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from coreserve.server.grpc.native._call_status import CANCELLED, INTERNAL, RESOURCE_EXHAUSTED, CallAborted

# What a message may inflate to on the event loop; the rest inflates on a worker thread, a slice
# at a time.
INLINE_BYTES = 256 * 1024
THREAD_SLICE_BYTES = 4 * 1024 * 1024
_WBITS = {b"gzip": 16 + zlib.MAX_WBITS, b"deflate": zlib.MAX_WBITS}
_THREADS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="coreserve-grpc-inflate")


class Compressed:
    """A message whose compressed flag was set: its bytes, still compressed."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


async def inflate(
    message: Compressed, encoding: bytes | None, limit: int, abandoned: Callable[[], bool]
) -> bytes:
    """The message inflated under the call's grpc-encoding; CallAborted where it cannot be, or
    once `abandoned()` (the client reset the call)."""
    wbits = _WBITS.get(encoding or b"")
    if wbits is None:
        raise CallAborted(INTERNAL, "a compressed message without a supported grpc-encoding")
    inflater = zlib.decompressobj(wbits)
    room = min(INLINE_BYTES, limit + 1)
    data = _inflated(inflater, message.data, room)
    if len(data) == room <= limit and not inflater.eof:  # more to come: off the loop
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(_THREADS, _rest, inflater, data, limit, abandoned)
    _check(inflater, len(data), limit)
    return data


def _rest(inflater: zlib._Decompress, first: bytes, limit: int, abandoned: Callable[[], bool]) -> bytes:
    """The rest of a message after its first slice, checked and joined to it. In slices, so
    that the interpreter lock is never held for long (zlib lets go of it while it inflates, not
    while it copies its output), and a bomb stops one slice past the limit, never joined."""
    pieces = [first]
    size = len(first)
    while not inflater.eof and size <= limit:
        if abandoned():
            raise CallAborted(CANCELLED, "the call was reset while its message inflated")
        piece = _inflated(inflater, inflater.unconsumed_tail, min(THREAD_SLICE_BYTES, limit + 1 - size))
        if not piece:
            break  # all input taken and no more output: a stream cut short
        pieces.append(piece)
        size += len(piece)
    _check(inflater, size, limit)
    return b"".join(pieces)


def _inflated(inflater: zlib._Decompress, data: bytes, max_length: int) -> bytes:
    try:
        return inflater.decompress(data, max_length)
    except zlib.error as exc:
        raise CallAborted(INTERNAL, f"the message does not decompress: {exc}") from None


def _check(inflater: zlib._Decompress, size: int, limit: int) -> None:
    """Refuses a message inflated to `size` bytes past `limit`, or whose stream is not whole."""
    if size > limit:
        raise CallAborted(RESOURCE_EXHAUSTED, f"Received message larger than max ({size} vs. {limit})")
    if not inflater.eof:
        raise CallAborted(INTERNAL, "the message does not decompress: its stream is truncated")
    if inflater.unused_data:
        trailing = len(inflater.unused_data)
        raise CallAborted(INTERNAL, f"the message does not decompress: {trailing} bytes follow its stream")
