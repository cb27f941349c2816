"""What every fuzz test asserts, and strategies that more than one of them draws from.

The property of the whole suite: client input gets a client error (a CoreserveError whose HTTP
status is 4xx, with a message) or a valid answer — never a 5xx, never another exception type.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from hypothesis import strategies as st

from coreserve.config import ModelSignature, parse_config
from coreserve.errors import CoreserveError
from coreserve.protos import grpc_service_pb2 as pb
from coreserve.server.http import HTTP_STATUS
from coreserve.types import DataType

T = TypeVar("T")

# JSON values of every kind, nested a little: what a careless or hostile client may put anywhere.
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=8,
)

# Integers near the edges that codecs tend to get wrong (sizes, counts, dims, lengths).
edge_integers = st.sampled_from([-(2**63), -(2**31), -1, 0, 1, 2**31 - 1, 2**32, 2**63 - 1, 2**64, 2**100]) | st.integers(
    -5, 70
)

DATATYPES = list(DataType)

# Triton's "simple" example model: the signature most real requests are checked against.
SIMPLE = ModelSignature(
    parse_config(
        """
        name: "simple" max_batch_size: 8
        input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]
        """
    )
)


def client_error_or_answer(call: Callable[[], T]) -> T | None:
    """Runs `call`; returns its answer, or None when it raised a client error.

    Any other outcome fails the test: a CoreserveError that maps to a 5xx, one without a
    message, or an exception that is not a CoreserveError at all (it would reach the log as a
    traceback and the client as a 500).
    """
    try:
        return call()
    except CoreserveError as exc:
        status = HTTP_STATUS[exc.code]
        assert status < 500, f"client input answered {status}: {type(exc).__name__}: {exc.message}"
        assert exc.message.strip(), f"{type(exc).__name__} without a message"
        return None


def element_values(datatype: DataType) -> st.SearchStrategy[Any]:
    """One tensor element of `datatype` as its JSON form carries it."""
    if datatype is DataType.BYTES:
        return st.text(max_size=6)
    if datatype is DataType.BOOL:
        return st.booleans()
    if datatype.value.startswith(("INT", "UINT")):
        bits = int(datatype.value.removeprefix("U").removeprefix("INT"))
        if datatype.value.startswith("U"):
            return st.integers(0, 2**bits - 1)
        return st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    return st.floats(-1000, 1000, width=16 if datatype in (DataType.FP16, DataType.BF16) else 32)


@st.composite
def valid_tensors(draw: st.DrawFn, max_dims: int = 3) -> tuple[DataType, list[int], list[Any]]:
    """A datatype, a small shape and a flat list of matching element values."""
    datatype = draw(st.sampled_from(DATATYPES))
    shape = draw(st.lists(st.integers(0, 3), max_size=max_dims))
    values = draw(st.lists(element_values(datatype), min_size=math.prod(shape), max_size=math.prod(shape)))
    return datatype, shape, values


_CONTENTS_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "bool_contents": st.booleans(),
    "int_contents": st.integers(-(2**31), 2**31 - 1),
    "int64_contents": st.integers(-(2**63), 2**63 - 1),
    "uint_contents": st.integers(0, 2**32 - 1),
    "uint64_contents": st.integers(0, 2**64 - 1),
    "fp32_contents": st.floats(width=32),
    "fp64_contents": st.floats(),
    "bytes_contents": st.binary(max_size=6),
}


def _set_parameter(parameter: Any, choice: str | None, value: Any) -> None:
    """Sets one oneof member of an InferParameter (or none, leaving it empty)."""
    if choice is not None:
        setattr(parameter, choice, value)


_PARAMETER_CHOICES = st.one_of(
    st.tuples(st.just("bool_param"), st.booleans()),
    st.tuples(st.just("int64_param"), st.integers(-(2**63), 2**63 - 1)),
    st.tuples(st.just("string_param"), st.text(max_size=6)),
    st.tuples(st.just("double_param"), st.floats()),
    st.tuples(st.just("uint64_param"), st.integers(0, 2**64 - 1)),
    st.tuples(st.none(), st.none()),
)


@st.composite
def model_infer_requests(draw: st.DrawFn, model_names: Sequence[str] = ("m",)) -> pb.ModelInferRequest:
    """A ModelInferRequest that is valid, or nearly: wrong datatypes, shapes, sizes, contents."""
    message = pb.ModelInferRequest(model_name=draw(st.sampled_from(model_names)), id=draw(st.text(max_size=4)))
    use_raw = draw(st.booleans())
    raw: list[bytes] = []
    for index in range(draw(st.integers(0, 3))):
        datatype, shape, values = draw(valid_tensors())
        tensor = message.inputs.add(name=draw(st.sampled_from([f"INPUT{index}", "INPUT0", ""])))
        tensor.datatype = draw(st.just(datatype.value) | st.sampled_from(DATATYPES).map(str) | st.text(max_size=5))
        shape = draw(
            st.just(shape)
            | st.lists(edge_integers.filter(lambda n: -(2**63) <= n < 2**63), max_size=5)
            | st.lists(st.just(1), min_size=63, max_size=66)
        )
        tensor.shape.extend(shape)
        if use_raw:
            # The right size for the original small shape (a size under 4 KiB for a huge one).
            data = b""
            if datatype is not DataType.BYTES and datatype.itemsize is not None:
                data = bytes(math.prod(s for s in tensor.shape if s > 0) * datatype.itemsize % 4096)
            raw.append(draw(st.just(data) | st.binary(max_size=64)))
        else:
            field = draw(st.sampled_from(sorted(_CONTENTS_VALUES)))
            count = draw(st.just(len(values)) | st.integers(0, 8))
            getattr(tensor.contents, field).extend(draw(st.lists(_CONTENTS_VALUES[field], min_size=count, max_size=count)))
        for key, (choice, value) in draw(st.dictionaries(st.sampled_from(["binary_data_size", "x"]), _PARAMETER_CHOICES, max_size=2)).items():
            _set_parameter(tensor.parameters[key], choice, value)
    if use_raw:
        extra = draw(st.integers(-1, 1))
        raw = raw[: max(0, len(raw) + extra)] if extra < 0 else raw + [b"\0"] * extra
        message.raw_input_contents.extend(raw)
    for key, (choice, value) in draw(
        st.dictionaries(st.sampled_from(["priority", "timeout", "sequence_id", "sequence_start", "z"]), _PARAMETER_CHOICES, max_size=3)
    ).items():
        _set_parameter(message.parameters[key], choice, value)
    for name in draw(st.lists(st.sampled_from(["OUTPUT0", "OUTPUT1", "nope", ""]), max_size=2)):
        output = message.outputs.add(name=name)
        if draw(st.booleans()):
            _set_parameter(output.parameters["classification"], "int64_param", 2)
    return message
