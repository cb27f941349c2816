"""The header blocks of a connection's answers, with the fields every answer repeats indexed.

Every answer's headers carry `content-type: application/grpc` and, as Triton's do, the
encodings the server reads (`grpc-accept-encoding`, not in a trailers-only answer); its
trailers, where the call succeeded, carry `grpc-status: 0`. As grpc's own servers do (Triton's
among them), the first answer on a connection adds each to the HPACK dynamic table, and every
later one names them by index: one byte each instead of a literal that the client parses again
every call, which saves the client CPU on every call (docs/benchmarks.md). Every other field
(error statuses and their messages, grpc-encoding, the answers to refused requests) stays a
literal without indexing.

The encoder's table must stay in step with the client's decoder:
- a block is encoded when it is written, in the order the client reads the blocks (trailers
  that flow control holds back are encoded when they go out, not when the call ends);
- a client that lowers SETTINGS_HEADER_TABLE_SIZE gets a dynamic table size update at the
  start of the next block, as RFC 7541 (4.2) asks: strict decoders (nghttp2's) refuse a block
  without it. Below what the two fields need, the table is emptied and nothing is indexed again.
"""

from __future__ import annotations

from coreserve.server.grpc.native.frames import _wire as wire

CONTENT_TYPE = (b"content-type", b"application/grpc")
# Triton's words; the request encodings calls.refused_call lets through.
ACCEPT_ENCODING = (b"grpc-accept-encoding", b"identity, deflate, gzip")
GRPC_STATUS_OK = (b"grpc-status", b"0")
INDEXED = (CONTENT_TYPE, ACCEPT_ENCODING, GRPC_STATUS_OK)
# RFC 7541 4.1: an entry's size is its name and value and 32.
TABLE_NEEDED = sum(len(name) + len(value) + 32 for name, value in INDEXED)


class ResponseHeaderEncoder:
    """One connection's encoder for the header blocks it writes (headers, trailers, refusals)."""

    def __init__(self) -> None:
        # The fields added to the table, oldest first, each with the bytes that name it by index.
        self._named: dict[tuple[bytes, bytes], bytes] = {}
        self._indexing = True
        self._limit = wire.DEFAULT_HEADER_TABLE_SIZE  # the table size the client's decoder allows
        self._update = b""  # a table size update due at the start of the next block

    def table_size(self, size: int) -> None:
        """The client's SETTINGS_HEADER_TABLE_SIZE (a raise changes nothing: the table is small)."""
        if size >= self._limit:
            return
        self._limit = size
        self._update = wire.table_size_update(size)
        if size < TABLE_NEEDED:  # the decoder evicts entries: refer to none of them again
            self._indexing = False
            self._named.clear()

    def headers(self, gzip: bool = False) -> bytes:
        block = self._take_update() + self._status_and_type() + self._field(ACCEPT_ENCODING)
        return (block + wire.literal(b"grpc-encoding", b"gzip")) if gzip else block

    def trailers(self, code: int, details: str, with_headers: bool) -> bytes:
        """The block that ends a call; `with_headers`: the call sent no headers (trailers only)."""
        # The status first: the table changes only for a block that is made whole.
        status = wire.status_trailers(code, details) if code != 0 or details else None
        block = self._take_update() + (self._status_and_type() if with_headers else b"")
        return block + (self._field(GRPC_STATUS_OK) if status is None else status)

    def literal_block(self, block: bytes) -> bytes:
        """A block of literals made elsewhere (the answer to a refused request)."""
        return self._take_update() + block

    def _status_and_type(self) -> bytes:
        """What every answer's headers begin with (a trailers-only answer's too)."""
        return wire.STATUS_200 + self._field(CONTENT_TYPE)

    def _take_update(self) -> bytes:
        update, self._update = self._update, b""
        return update

    def _field(self, field: tuple[bytes, bytes]) -> bytes:
        named = self._named.get(field)
        if named is not None:
            return named
        if not self._indexing:
            return wire.literal(*field)
        table = [*self._named, field]
        # The newest entry is FIRST_DYNAMIC_INDEX: each addition moves the older ones up by one.
        oldest = wire.FIRST_DYNAMIC_INDEX + len(table) - 1
        self._named = {entry: wire.indexed(oldest - position) for position, entry in enumerate(table)}
        return wire.literal_indexed(*field)
