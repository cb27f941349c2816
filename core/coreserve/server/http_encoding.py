"""Content codings of HTTP bodies: gzip and deflate requests read whole and checked, responses compressed."""

from __future__ import annotations

import zlib


class BodyTooLarge(Exception):
    """A request body past the size limit once decompressed."""


_GZIP_WBITS = 16 + zlib.MAX_WBITS
_WBITS = {"gzip": _GZIP_WBITS, "x-gzip": _GZIP_WBITS, "deflate": zlib.MAX_WBITS}


def decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """The body under its Content-Encoding (gzip or deflate); raises ValueError if corrupt,
    truncated or followed by anything but another gzip member, BodyTooLarge past `limit` bytes."""
    wbits = _WBITS.get(encoding)
    if wbits is None:
        raise ValueError(f"unsupported Content-Encoding '{encoding}'")
    parts: list[bytes] = []
    size = 0
    while True:
        inflater, data = _inflate(body, wbits, limit - size)
        size += len(data)
        if size > limit:
            raise BodyTooLarge()
        parts.append(data)
        if not inflater.eof:  # a stream cut short: no end block, or no CRC trailer
            raise ValueError(f"the {encoding} stream is truncated")
        body = inflater.unused_data
        if not body:
            return parts[0] if len(parts) == 1 else b"".join(parts)
        if wbits != _GZIP_WBITS or not body.startswith(b"\x1f\x8b"):  # gzip allows several members
            raise ValueError(f"{len(body)} bytes of trailing data after the {encoding} stream")


def _inflate(body: bytes, wbits: int, limit: int) -> tuple[zlib._Decompress, bytes]:
    """Inflates one stream, up to one byte past `limit`; the inflater tells where it ended."""
    inflater = zlib.decompressobj(wbits)
    try:
        return inflater, inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        if wbits != zlib.MAX_WBITS:
            raise ValueError(str(exc)) from None
    raw = zlib.decompressobj(-zlib.MAX_WBITS)  # some clients send deflate without the zlib header
    try:
        return raw, raw.decompress(body, limit + 1)
    except zlib.error as exc:
        raise ValueError(str(exc)) from None


def accepted_encoding(accept: str) -> str | None:
    """The encoding to compress a response with, of those an Accept-Encoding header offers."""
    offered = {part.split(";")[0].strip().lower() for part in accept.split(",")}
    for encoding in ("gzip", "deflate"):
        if encoding in offered:
            return encoding
    return None


def compress(body: bytes, encoding: str) -> bytes:
    """The body compressed with `encoding` (gzip or deflate)."""
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    compressor = zlib.compressobj(6, zlib.DEFLATED, wbits)
    return compressor.compress(body) + compressor.flush()
