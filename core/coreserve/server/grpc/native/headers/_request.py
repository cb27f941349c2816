"""A connection's request header blocks, decoded (`_hpack_decoder`) and read as gRPC uses them.

gRPC clients send the same header block again and again once their fields are in the HPACK
dynamic table (every field indexed), so a block's bytes seen before decode to the same fields
as long as the table has not changed since: those come from a dict instead of the decoder.
A block is also checked against RFC 9113's rules for a request (8.2, 8.3): one that breaks
them is malformed, and its stream is reset.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from dataclasses import dataclass

from coreserve.server.grpc.native.frames._wire import COMPRESSION_ERROR, ENHANCE_YOUR_CALM, ConnectionFault
from coreserve.server.grpc.native.headers._hpack_decoder import (
    Field,
    HeaderDecodingError,
    HeaderListTooLarge,
    HpackDecoder,
)

# Distinct blocks remembered per connection: clients repeat a handful (one per method and
# metadata combination); blocks seen once (a deadline in each) pass through, the oldest going
# first. Only small blocks of small lists are kept, so the cache of a connection stays small.
CACHE_ENTRIES = 64
CACHED_BLOCK_BYTES = 1024
CACHED_LIST_BYTES = 4096


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
    size: int  # RFC 9113's header list size: names + values + 32 per field (all of them)
    malformed: str | None = None  # a field RFC 9113 (8.2, 8.3) does not allow, if any
    pseudo_complete: bool = True  # :method, :scheme and :path came (a request needs them)
    has_pseudo: bool = True  # some pseudo-header came (trailers may have none)


_RESERVED = frozenset(
    {b"te", b"content-type", b"grpc-timeout", b"grpc-encoding", b"user-agent", b"grpc-accept-encoding"}
)
_REQUEST_PSEUDO = frozenset({b":method", b":scheme", b":path", b":authority"})
# RFC 9113 8.2.2: fields of HTTP/1.1 connections that an HTTP/2 request must not carry.
_CONNECTION_SPECIFIC = frozenset(
    {b"connection", b"proxy-connection", b"keep-alive", b"transfer-encoding", b"upgrade"}
)


def _request_headers(fields: Iterable[Field], size: int, invalid: Field | None) -> RequestHeaders:
    pseudo: dict[bytes, bytes] = {}
    metadata: list[tuple[str, str | bytes]] = []
    content_type = b""
    timeout = encoding = None
    accepts_gzip = False
    malformed = None if invalid is None else f"the field {invalid[0]!r} is not valid in HTTP/2"
    regular = False  # a field that is not a pseudo-header came
    for name, value in fields:
        if name.startswith(b":"):
            if regular or name not in _REQUEST_PSEUDO or name in pseudo:
                malformed = f"the pseudo-header {name.decode('latin-1')} is misplaced, repeated or unknown"
            pseudo[name] = value
            continue
        regular = True
        if name in _CONNECTION_SPECIFIC or (name == b"te" and value != b"trailers"):
            malformed = f"the connection-specific field {name.decode('latin-1')}"
        if name == b"content-type":
            content_type = value
        elif name == b"grpc-timeout":
            timeout = value
        elif name == b"grpc-encoding":
            encoding = value
        elif name == b"grpc-accept-encoding":
            accepts_gzip = b"gzip" in value
        if name in _RESERVED:
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
        malformed=malformed,
        pseudo_complete=b":method" in pseudo and b":scheme" in pseudo and b":path" in pseudo,
        has_pseudo=bool(pseudo),
    )


def _unbase64(value: bytes) -> bytes:
    try:
        return base64.b64decode(value + b"=" * (-len(value) % 4))
    except ValueError:
        return b""


class HeaderBlockDecoder:
    """One connection's HPACK decoder and its cache of repeated blocks."""

    def __init__(self, max_list_size: int, max_table_size: int = 4096) -> None:
        self._decoder = HpackDecoder(max_table_size, max_list_size)
        self._cache: dict[bytes, RequestHeaders] = {}

    def decode(self, block: bytes) -> RequestHeaders:
        """The headers of `block`; ConnectionFault(COMPRESSION_ERROR) when it does not decode.

        A list past the limit keeps only the fields before it (its `size` says how large it
        is): the request is refused, and nothing more of it is kept. Past twice the limit,
        ConnectionFault(ENHANCE_YOUR_CALM).
        """
        cached = self._cache.get(block)
        if cached is not None:
            return cached
        decoder = self._decoder
        changes = decoder.changes
        try:
            fields, size = decoder.decode(block)
        except HeaderDecodingError as exc:
            # The dynamic table is now out of step with the client's: nothing later decodes.
            raise ConnectionFault(COMPRESSION_ERROR, f"header block does not decode: {exc}") from None
        except HeaderListTooLarge as exc:  # no request needs it; the table is out of step too
            raise ConnectionFault(ENHANCE_YOUR_CALM, str(exc)) from None
        headers = _request_headers(fields, size, decoder.invalid)
        if decoder.changes != changes:
            # This block changed the table: blocks cached before may now mean other fields.
            self._cache.clear()
        elif len(block) <= CACHED_BLOCK_BYTES and size <= CACHED_LIST_BYTES and headers.malformed is None:
            if len(self._cache) == CACHE_ENTRIES:  # the oldest goes: blocks seen once pass through
                del self._cache[next(iter(self._cache))]
            self._cache[block] = headers
        return headers
