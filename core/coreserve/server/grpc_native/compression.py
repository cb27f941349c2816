"""Compressed gRPC messages (grpc-encoding gzip or deflate), inflated without holding up the loop.

A few hundred kilobytes of gzip can inflate to hundreds of megabytes, so a message is inflated
by its call's handler task, not by the connection's read: its first slice on the event loop
(a small message is done there), the rest on a worker thread, where zlib lets go of the
interpreter lock. A stream cut short or followed by other bytes is INTERNAL, as grpc's core
answers; one past the message size limit is RESOURCE_EXHAUSTED, found without inflating more
than one byte past the limit.
"""

from __future__ import annotations

import asyncio
import zlib

from coreserve.server.grpc_native.call_status import INTERNAL, RESOURCE_EXHAUSTED, CallAborted

# What a message may inflate to on the event loop; the rest inflates on a worker thread.
INLINE_BYTES = 256 * 1024
_WBITS = {b"gzip": 16 + zlib.MAX_WBITS, b"deflate": zlib.MAX_WBITS}


class Compressed:
    """A message whose compressed flag was set: its bytes, still compressed."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


async def inflate(message: Compressed, encoding: bytes | None, limit: int) -> bytes:
    """The message inflated under the call's grpc-encoding; CallAborted where it cannot be."""
    wbits = _WBITS.get(encoding or b"")
    if wbits is None:
        raise CallAborted(INTERNAL, "a compressed message without a supported grpc-encoding")
    inflater = zlib.decompressobj(wbits)
    room = min(INLINE_BYTES, limit + 1)
    data = _inflated(inflater, message.data, room)
    if len(data) == room <= limit and not inflater.eof:  # more to come: off the loop
        rest = inflater.unconsumed_tail
        data = b"".join((data, await asyncio.to_thread(_inflated, inflater, rest, limit + 1 - room)))
    if len(data) > limit:
        raise CallAborted(RESOURCE_EXHAUSTED, f"Received message larger than max ({len(data)} vs. {limit})")
    if not inflater.eof:
        raise CallAborted(INTERNAL, "the message does not decompress: its stream is truncated")
    if inflater.unused_data:
        trailing = len(inflater.unused_data)
        raise CallAborted(INTERNAL, f"the message does not decompress: {trailing} bytes follow its stream")
    return data


def _inflated(inflater: zlib._Decompress, data: bytes, max_length: int) -> bytes:
    try:
        return inflater.decompress(data, max_length)
    except zlib.error as exc:
        raise CallAborted(INTERNAL, f"the message does not decompress: {exc}") from None
