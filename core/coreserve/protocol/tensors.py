"""Tensor data as the v2 protocols carry it: JSON lists and raw little-endian bytes ⇄ numpy."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson

from coreserve.errors import InvalidArgumentError, RequestMismatchError
from coreserve.protocol.bytes_codec import decode_bytes_tensor, encode_bytes_tensor
from coreserve.types import NUMPY_DTYPES, DataType

_INTEGER_TYPES = frozenset(
    (
        DataType.UINT8,
        DataType.UINT16,
        DataType.UINT32,
        DataType.UINT64,
        DataType.INT8,
        DataType.INT16,
        DataType.INT32,
        DataType.INT64,
    )
)
_FLOAT_TYPES = frozenset((DataType.FP16, DataType.FP32, DataType.FP64, DataType.BF16))
# Which kinds of JSON-decoded numpy arrays may become which non-integer datatype.
_ACCEPTED_KINDS = {
    **dict.fromkeys(_FLOAT_TYPES, "iuf"),
    DataType.BOOL: "b",
}


_DATATYPES: dict[object, DataType] = {datatype.value: datatype for datatype in DataType}


def parse_datatype(value: object, name: str) -> DataType:
    # A dict lookup: the enum's own call costs a microsecond per tensor (both codecs call this).
    datatype = _DATATYPES.get(value) if isinstance(value, str) else None
    if datatype is None:
        known = ", ".join(DataType)
        text = repr(value)
        if len(text) > 100:
            text = text[:100] + "..."
        raise InvalidArgumentError(
            f"invalid datatype for input {name}: unknown datatype {text}; known: {known}"
        )
    return datatype


# numpy's limits: at most 64 dimensions, and an array's byte size must fit in a signed 64-bit
# integer (checked with the widest element, 8 bytes, so that every datatype fits).
MAX_DIMS = 64
_MAX_ELEMENTS = (2**63 - 1) // 8


def parse_shape(value: object, name: str) -> tuple[int, ...]:
    """The shape of a JSON tensor: a list of non-negative integers that numpy can hold."""
    if not isinstance(value, list) or not all(type(d) is int and d >= 0 for d in value):
        text = repr(value)
        raise InvalidArgumentError(
            f"input '{name}' needs 'shape': a list of non-negative integers, got "
            f"{text if len(text) <= 200 else text[:200] + '...'}"
        )
    return check_shape(tuple(value), name)


def check_shape(shape: tuple[int, ...], name: str) -> tuple[int, ...]:
    """Returns `shape` if numpy can make an array of it; raises InvalidArgumentError if not.

    Without this, numpy's own ValueError would escape the codecs as a server fault.
    """
    if len(shape) > MAX_DIMS:
        raise InvalidArgumentError(
            f"input '{name}' has {len(shape)} dimensions; at most {MAX_DIMS} are supported"
        )
    elements = 1
    for dim in shape:
        if dim < 0:
            raise InvalidArgumentError(f"input '{name}' has a negative dimension in its shape {list(shape)}")
        # Zero-sized dimensions do not shrink what numpy checks: it multiplies the others.
        elements *= dim or 1
        if elements > _MAX_ELEMENTS:
            raise InvalidArgumentError(f"input '{name}' has a shape too large for any tensor: {list(shape)}")
    return shape


def element_count(shape: Sequence[int]) -> int:
    return math.prod(shape)


def array_from_json(data: Any, datatype: DataType, shape: tuple[int, ...], name: str) -> np.ndarray:
    """Converts JSON tensor data (flat or nested, row-major) into an array of `shape`.

    Values must have the datatype's JSON type: strings for BYTES, integers for integer types
    (in range), numbers for floating-point types, booleans for BOOL.
    """
    count = element_count(shape)
    flat, types = _flatten(data, name)
    # Each mistake of type starts with Triton's words (http_server.cc, TritonJson).
    if datatype is DataType.BYTES:
        if not types <= {str}:
            raise InvalidArgumentError(
                "Unable to parse JSON bytes array: attempt to access JSON non-string as string "
                f"(input '{name}' is BYTES: its JSON data must be strings)"
            )
        array = np.empty(len(flat), dtype=np.object_)
        array[:] = [item.encode("utf-8") for item in flat]
    elif datatype in _INTEGER_TYPES:
        if not types <= {int}:
            kind = "unsigned-integer" if datatype.name.startswith("UINT") else "signed-integer"
            raise InvalidArgumentError(
                f"Unable to parse 'data': attempt to access JSON non-{kind} as {kind} "
                f"(input '{name}' is {datatype}: its JSON data must be integers)"
            )
        try:
            array = np.array(flat, dtype=NUMPY_DTYPES[datatype])
        except OverflowError:
            info = np.iinfo(NUMPY_DTYPES[datatype])
            raise InvalidArgumentError(
                f"input '{name}' has values outside the range of {datatype} ({info.min}..{info.max})"
            ) from None
    else:
        try:
            source = np.array(flat)
        except (ValueError, OverflowError) as exc:
            raise InvalidArgumentError(f"input '{name}' has malformed data: {exc}") from None
        kind = "b" if bool in types and datatype is not DataType.BOOL else source.dtype.kind  # ([1.5, true])
        if source.size and kind not in _ACCEPTED_KINDS[datatype]:
            expected = "non-boolean as boolean" if datatype is DataType.BOOL else "non-number as double"
            raise InvalidArgumentError(
                f"Unable to parse 'data': attempt to access JSON {expected} (input '{name}' has data "
                f"that is not {datatype}: found {_describe_kind(kind)})"
            )
        with np.errstate(over="ignore"):  # a value beyond FP16/FP32 becomes inf, as in a C cast
            array = source.astype(NUMPY_DTYPES[datatype], copy=False)
    if array.size != count:
        raise InvalidArgumentError(
            f"input '{name}' has {array.size} elements but its shape {list(shape)} needs {count}"
        )
    return array.reshape(shape)


def _flatten(data: Any, name: str) -> tuple[list[Any], set[type]]:
    """The values of nested lists in row-major order, and the types among them."""
    if not isinstance(data, list):
        raise InvalidArgumentError(f"input '{name}' needs 'data' as a JSON list")
    types = set(map(type, data))
    if list not in types:
        return data, types
    flat: list[Any] = []
    stack: list[Any] = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(reversed(item))
        else:
            flat.append(item)
    return flat, set(map(type, flat))


def _describe_kind(kind: str) -> str:
    return {
        "b": "booleans",
        "i": "integers",
        "u": "integers",
        "f": "numbers with fractions",
        "U": "strings",
        "O": "mixed or null values",
    }.get(kind, f"numpy kind '{kind}'")


def array_from_bytes(
    buffer: memoryview, datatype: DataType, shape: tuple[int, ...], name: str, model: str = ""
) -> np.ndarray:
    """Wraps raw tensor bytes as an array of `shape`, without copying when aligned.

    `model` (the model's name, when known) makes the size errors Triton's, word for word.
    """
    count = element_count(shape)
    if datatype is DataType.BYTES:
        return decode_bytes_tensor(buffer, count, name, model).reshape(shape)
    dtype = NUMPY_DTYPES[datatype]
    expected = count * dtype.itemsize
    if len(buffer) != expected:
        for_model = f" for model '{model}'" if model else ""
        raise RequestMismatchError(
            f"input byte size mismatch for input '{name}'{for_model}. Expected {expected}, got "
            f"{len(buffer)} ({count} {datatype} elements of shape {list(shape)})"
        )
    array = np.frombuffer(buffer, dtype=dtype).reshape(shape)
    # Frameworks may use the memory in place; give them aligned memory.
    return array if array.flags.aligned else array.copy()


def array_to_bytes(array: np.ndarray, datatype: DataType) -> bytes | memoryview:
    """The raw wire form of an array: row-major little-endian bytes, or the BYTES encoding."""
    if datatype is DataType.BYTES:
        return encode_bytes_tensor(array)
    contiguous = np.ascontiguousarray(array)
    return contiguous.reshape(-1).view(np.uint8).data


def array_to_json(array: np.ndarray, datatype: DataType, name: str, single: bool = False) -> Any:
    """The JSON form of an array's data: a flat row-major list, or a flat numpy array that
    orjson serializes natively; `single`: a one-element array as its one value (the generate
    extension's form)."""
    if datatype is DataType.BYTES:
        try:
            texts = [item.decode("utf-8") if isinstance(item, bytes) else str(item) for item in array.ravel()]
        except UnicodeDecodeError:
            raise InvalidArgumentError(
                f"output '{name}' holds bytes that are not UTF-8 text; request it as binary data"
            ) from None
        return texts[0] if single and len(texts) == 1 else texts
    flat = np.ascontiguousarray(array).ravel()
    if datatype in _FLOAT_TYPES:
        # As Triton writes them: each as the double it widens to (0.1 in FP32 is
        # 0.10000000149011612), the non-finite ones as NaN, Infinity and -Infinity.
        finite = bool(np.isfinite(flat).all())
        flat = flat.astype(np.float64, copy=False)
        if not finite:
            values = flat.tolist()
            return non_finite_floats(values[0] if single and len(values) == 1 else values)
    return flat.item() if single and flat.size == 1 else flat


# JSON numbers as Triton reads and writes them. Triton's RapidJSON reads and writes the non-finite
# floats as the tokens `NaN`, `Infinity` and `-Infinity` (tritonclient sends them in JSON tensor
# data, as Python's json writes them). orjson refuses to read them and writes them as `null`;
# these functions stand in for it where a tensor or a request may hold one. Finite numbers are
# orjson's, at its speed.

_NON_FINITE_TOKENS = (b"NaN", b"Infinity")


def json_loads(text: bytes | bytearray | memoryview | str) -> Any:
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
