"""Decoding a connection's request header blocks: HPACK through `hpack`, with a cache.

gRPC clients send the same header block again and again once their fields are in the HPACK
dynamic table (every field indexed), so a block's bytes seen before decode to the same fields
as long as the table has not changed since: those come from a dict instead of the decoder.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import hpack
from hpack.table import HeaderTable

from coreserve.server.grpc_native.wire import COMPRESSION_ERROR, ConnectionFault

# Distinct blocks remembered per connection: clients repeat a handful (one per method and
# metadata combination); a client that varies its blocks only fills the cache up to this.
CACHE_ENTRIES = 64


@dataclass(frozen=True)
class RequestHeaders:
    """What a gRPC request's header block says, as the native server uses it."""

    method: bytes
    path: str
    content_type: bytes
    timeout: bytes | None
    encoding: bytes | None
    accepts_gzip: bool  # grpc-accept-encoding names gzip
    metadata: tuple[tuple[str, str | bytes], ...]
    size: int  # RFC 9113's header list size: names + values + 32 per field


_RESERVED = frozenset(
    {b"te", b"content-type", b"grpc-timeout", b"grpc-encoding", b"user-agent", b"grpc-accept-encoding"}
)


def _request_headers(fields: Iterable[tuple[bytes, bytes]]) -> RequestHeaders:
    pseudo: dict[bytes, bytes] = {}
    metadata: list[tuple[str, str | bytes]] = []
    content_type = b""
    timeout = encoding = None
    accepts_gzip = False
    size = 0
    for name, value in fields:
        size += len(name) + len(value) + 32
        if name.startswith(b":"):
            pseudo[name] = value
        elif name == b"content-type":
            content_type = value
        elif name == b"grpc-timeout":
            timeout = value
        elif name == b"grpc-encoding":
            encoding = value
        elif name == b"grpc-accept-encoding":
            accepts_gzip = b"gzip" in value
        if name in _RESERVED or name.startswith(b":"):
            if name == b"user-agent":
                metadata.append(("user-agent", value.decode("latin-1")))
            continue
        key = name.decode("latin-1")
        # Binary metadata ("-bin") is base64 on the wire; grpc hands servicers the bytes.
        metadata.append((key, _unbase64(value) if key.endswith("-bin") else value.decode("latin-1")))
    return RequestHeaders(
        method=pseudo.get(b":method", b""),
        path=pseudo.get(b":path", b"").decode("latin-1"),
        content_type=content_type,
        timeout=timeout,
        encoding=encoding,
        accepts_gzip=accepts_gzip,
        metadata=tuple(metadata),
        size=size,
    )


def _unbase64(value: bytes) -> bytes:
    import base64

    try:
        return base64.b64decode(value + b"=" * (-len(value) % 4))
    except ValueError:
        return b""


class _CountedTable(HeaderTable):
    """hpack's dynamic table, counting the changes that shift what an index means."""

    def __init__(self) -> None:
        super().__init__()
        self.changes = 0

    def add(self, name: bytes, value: bytes) -> None:
        self.changes += 1
        super().add(name, value)

    def _shrink(self) -> None:
        self.changes += 1
        super()._shrink()


class HeaderBlockDecoder:
    """One connection's HPACK decoder and its cache of repeated blocks."""

    def __init__(self, max_table_size: int = 4096) -> None:
        self._decoder = hpack.Decoder()
        self._table = self._decoder.header_table = _CountedTable()
        self._decoder.max_allowed_table_size = max_table_size
        self._decoder.max_header_list_size = 2**31  # the connection checks the block's size itself
        self._cache: dict[bytes, RequestHeaders] = {}

    def decode(self, block: bytes) -> RequestHeaders:
        """The headers of `block`; ConnectionFault(COMPRESSION_ERROR) when it does not decode."""
        cached = self._cache.get(block)
        if cached is not None:
            return cached
        changes = self._table.changes
        try:
            fields = self._decoder.decode(block, raw=True)
        except hpack.HPACKError as exc:
            # The dynamic table is now out of step with the client's: nothing later decodes.
            raise ConnectionFault(COMPRESSION_ERROR, f"header block does not decode: {exc}") from None
        headers = _request_headers(fields)
        if self._table.changes != changes:
            # This block changed the table: blocks cached before may now mean other fields.
            self._cache.clear()
        elif len(self._cache) < CACHE_ENTRIES:
            self._cache[block] = headers
        return headers
