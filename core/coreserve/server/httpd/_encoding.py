"""Content codings of HTTP bodies: gzip and deflate requests read whole and checked, responses compressed."""

from __future__ import annotations

import zlib


class BodyTooLarge(Exception):
    """A request body past the size limit once decompressed."""


class UnsupportedEncoding(ValueError):
    """A request body under a Content-Encoding other than gzip and deflate."""


_GZIP_WBITS = 16 + zlib.MAX_WBITS
_WBITS = {"gzip": _GZIP_WBITS, "x-gzip": _GZIP_WBITS, "deflate": zlib.MAX_WBITS}


def decompress(body: bytes | bytearray, encoding: str, limit: int) -> bytes:
    """The body under its Content-Encoding (gzip or deflate); raises ValueError if corrupt,
    truncated or followed by anything but another gzip member, UnsupportedEncoding under
    another coding, BodyTooLarge past `limit` bytes."""
    wbits = _WBITS.get(encoding)
    if wbits is None:
        raise UnsupportedEncoding(f"unsupported Content-Encoding '{encoding}'")
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


def _inflate(body: bytes | bytearray, wbits: int, limit: int) -> tuple[zlib._Decompress, bytes]:
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


# The codings a response may take; identity (no coding) is always acceptable unless refused.
_CODINGS = ("gzip", "deflate", "identity")


def accepted_encoding(accept: str) -> str | None:
    """The encoding to compress a response with, as an Accept-Encoding header ranks them (RFC 9110
    12.5.3); None sends the body as it is.

    As Triton 2.51 chooses: the listed coding of gzip, deflate and identity with the highest q
    wins (q defaults to 1, the first listed wins a tie), q=0 refuses a coding, a coding whose q is
    not a number is passed over, and `*` is answered with identity (which `*` allows). Names are
    read case-insensitively as RFC 9110 says (Triton ignores `GZIP`). Nothing acceptable
    (`identity;q=0` alone, `*;q=0`) also gets identity: a readable answer beats a 406.
    """
    best: str | None = None
    best_weight = 0.0
    for element in accept.split(","):
        coding, _, parameters = element.partition(";")
        coding = coding.strip().lower()
        if coding not in _CODINGS:
            continue
        weight = _weight(parameters)
        if weight is not None and weight > best_weight:
            best, best_weight = coding, weight
    return None if best == "identity" else best


def _weight(parameters: str) -> float | None:
    """The q value of one Accept-Encoding element's parameters (1 without one), None if malformed."""
    for parameter in parameters.split(";"):
        name, equals, value = parameter.partition("=")
        if equals and name.strip().lower() == "q":
            try:
                weight = float(value.strip())
            except ValueError:
                return None
            return weight if weight == weight else None  # NaN ranks nowhere
    return 1.0


def compress(body: bytes | bytearray, encoding: str) -> bytes:
    """The body compressed with `encoding` (gzip or deflate)."""
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    compressor = zlib.compressobj(6, zlib.DEFLATED, wbits)
    return compressor.compress(body) + compressor.flush()
