"""JSON numbers as Triton reads and writes them.

Triton's RapidJSON reads and writes the non-finite floats as the tokens `NaN`, `Infinity` and
`-Infinity` (tritonclient sends them in JSON tensor data, as Python's json writes them). orjson
refuses to read them and writes them as `null`; these functions stand in for it where a tensor
or a request may hold one. Finite numbers are orjson's, at its speed.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

_NON_FINITE_TOKENS = (b"NaN", b"Infinity")


def loads(text: bytes | bytearray | memoryview | str) -> Any:
    """`text` read as orjson reads it, and as Python's json where it holds a non-finite number.
    Raises orjson.JSONDecodeError on malformed JSON."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        raw = text.encode() if isinstance(text, str) else bytes(text)
        if not any(token in raw for token in _NON_FINITE_TOKENS):
            raise
        try:
            document = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise orjson.JSONDecodeError(exc.msg, exc.doc, exc.pos) from None
        except (RecursionError, ValueError) as exc:  # too deep, not UTF-8, an integer of too many digits
            reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
            raise orjson.JSONDecodeError(reason, "", 0) from None
        try:  # what orjson refuses to read it refuses to write (a lone surrogate's escape)
            orjson.dumps(document)
        except TypeError as exc:
            raise orjson.JSONDecodeError(str(exc), "", 0) from None
        return document


def non_finite_floats(values: Any) -> orjson.Fragment:
    """`values` (floats, or lists of them), written as JSON with their non-finite numbers as
    Triton writes them; orjson.dumps copies the fragment as it is."""
    return orjson.Fragment(json.dumps(values, separators=(",", ":")).encode())
