"""gRPC's length-prefixed messages cut out of a stream's DATA bytes, with one copy per message.

DATA payloads arrive as views: of the bytes objects the socket gave (stable, kept as they are)
or of the connection's read buffer (copied, since the buffer moves on). A message is joined
from its pieces once, when its last byte is in.
"""

from __future__ import annotations

import struct
from collections import deque

_PREFIX = struct.Struct(">BI")


class MessageTooLarge(Exception):
    """A message's prefix announced more bytes than the server accepts."""

    def __init__(self, length: int) -> None:
        super().__init__(length)
        self.length = length


class MessageReader:
    """The messages of one stream, as their bytes come."""

    def __init__(self) -> None:
        self._pieces: deque[memoryview] = deque()
        self._size = 0
        self._length: int | None = None  # the message being read, once its prefix is in
        self._compressed = False

    @property
    def inside_message(self) -> bool:
        """Bytes of an unfinished message (or prefix) are waiting."""
        return self._size > 0 or self._length is not None

    def feed(self, payload: memoryview, stable: bool, max_size: int) -> list[tuple[bool, bytes]]:
        """The messages `payload` completes, as (compressed, bytes); MessageTooLarge past max_size."""
        if not payload:
            return []
        self._pieces.append(payload if stable else memoryview(bytes(payload)))
        self._size += len(payload)
        complete = []
        while True:
            if self._length is None:
                if self._size < 5:
                    break
                compressed, length = _PREFIX.unpack(self._take(5))
                if length > max_size:
                    raise MessageTooLarge(length)
                self._length, self._compressed = length, bool(compressed)
            if self._size < self._length:
                break
            complete.append((self._compressed, self._take(self._length)))
            self._length = None
        return complete

    def _take(self, count: int) -> bytes:
        pieces = self._pieces
        taken = []
        need = count
        while need:
            piece = pieces[0]
            if len(piece) <= need:
                taken.append(pieces.popleft())
                need -= len(piece)
            else:
                taken.append(piece[:need])
                pieces[0] = piece[need:]
                need = 0
        self._size -= count
        return b"".join(taken)
