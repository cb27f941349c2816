"""What every fuzz test asserts, and strategies that more than one of them draws from.

The property of the whole suite: client input gets a client error (a CoreserveError whose HTTP
status is 4xx, with a message) or a valid answer — never a 5xx, never another exception type.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from hypothesis import strategies as st

from coreserve.config import ModelSignature, config_to_dict, parse_config
from coreserve.errors import CoreserveError
from coreserve.protocol.bytes_codec import encode_bytes_tensor
from coreserve.protos import grpc_service_pb2 as pb
from coreserve.server.rest._frontend import HTTP_STATUS
from coreserve.types import NUMPY_DTYPES, DataType
from support.paths import EXAMPLES, TESTS

T = TypeVar("T")

# JSON values of every kind, nested a little: what a careless or hostile client may put anywhere.
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=8,
)

# Integers near the edges that codecs tend to get wrong (sizes, counts, dims, lengths).
edge_integers = st.sampled_from(
    [-(2**63), -(2**31), -1, 0, 1, 2**31 - 1, 2**32, 2**63 - 1, 2**64, 2**100]
) | st.integers(-5, 70)

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
    message = pb.ModelInferRequest(
        model_name=draw(st.sampled_from(model_names)), id=draw(st.text(max_size=4))
    )
    use_raw = draw(st.booleans())
    raw: list[bytes] = []
    for index in range(draw(st.integers(0, 3))):
        datatype, shape, values = draw(valid_tensors())
        tensor = message.inputs.add(name=draw(st.sampled_from([f"INPUT{index}", "INPUT0", ""])))
        tensor.datatype = draw(
            st.just(datatype.value) | st.sampled_from(DATATYPES).map(str) | st.text(max_size=5)
        )
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
            getattr(tensor.contents, field).extend(
                draw(st.lists(_CONTENTS_VALUES[field], min_size=count, max_size=count))
            )
        for key, (choice, value) in draw(
            st.dictionaries(st.sampled_from(["binary_data_size", "x"]), _PARAMETER_CHOICES, max_size=2)
        ).items():
            _set_parameter(tensor.parameters[key], choice, value)
    if use_raw:
        extra = draw(st.integers(-1, 1))
        raw = raw[: max(0, len(raw) + extra)] if extra < 0 else raw + [b"\0"] * extra
        message.raw_input_contents.extend(raw)
    for key, (choice, value) in draw(
        st.dictionaries(
            st.sampled_from(["priority", "timeout", "sequence_id", "sequence_start", "z"]),
            _PARAMETER_CHOICES,
            max_size=3,
        )
    ).items():
        _set_parameter(message.parameters[key], choice, value)
    for name in draw(st.lists(st.sampled_from(["OUTPUT0", "OUTPUT1", "nope", ""]), max_size=2)):
        output = message.outputs.add(name=name)
        if draw(st.booleans()):
            _set_parameter(output.parameters["classification"], "int64_param", 2)
    return message


def _binary_form(datatype: DataType, shape: list[int], values: list[Any]) -> bytes:
    if datatype is DataType.BYTES:
        array = np.empty(len(values), dtype=np.object_)
        array[:] = [value.encode() for value in values]
        return encode_bytes_tensor(array)
    return np.array(values, dtype=NUMPY_DTYPES[datatype]).tobytes()


@st.composite
def near_valid_bodies(draw: st.DrawFn) -> tuple[bytes, int | None]:
    """A valid v2 request body (JSON, or JSON + binary data), then up to three mutations."""
    inputs: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    for index in range(draw(st.integers(1, 3))):
        datatype, shape, values = draw(valid_tensors())
        item: dict[str, Any] = {"name": f"INPUT{index}", "datatype": datatype.value, "shape": shape}
        if draw(st.booleans()):
            data = _binary_form(datatype, shape, values)
            item["parameters"] = {"binary_data_size": len(data)}
            chunks.append(data)
        else:
            item["data"] = values
        inputs.append(item)
    document: dict[str, Any] = {"inputs": inputs}
    if draw(st.booleans()):
        parameters: dict[str, Any] = {"binary_data": draw(st.booleans())}
        if draw(st.booleans()):  # the classification extension: any K, any JSON value
            parameters["classification"] = draw(edge_integers | json_values)
        document["outputs"] = [{"name": "OUTPUT0", "parameters": parameters}]
    if draw(st.booleans()):
        document["id"] = draw(st.text(max_size=4))
    binary = b"".join(chunks)
    header_length: int | None = None

    for _ in range(draw(st.integers(0, 3))):
        target = draw(st.sampled_from(inputs))
        kind = draw(
            st.sampled_from(
                [
                    "datatype",
                    "shape",
                    "data",
                    "binary_data_size",
                    "parameters",
                    "request_parameters",
                    "outputs",
                    "id",
                    "drop_key",
                    "duplicate",
                    "binary_tail",
                    "header_length",
                    "inputs",
                ]
            )
        )
        if kind == "datatype":
            target["datatype"] = draw(st.sampled_from(DATATYPES).map(str) | json_values | st.just("int32"))
        elif kind == "shape":
            target["shape"] = draw(
                st.lists(edge_integers, max_size=5)
                | st.lists(st.just(1), min_size=60, max_size=70)
                | st.lists(st.sampled_from([0, 2**40]), min_size=2, max_size=3)
                | json_values
            )
        elif kind == "data":
            target["data"] = draw(
                json_values
                | st.lists(edge_integers, max_size=20)
                | st.lists(st.lists(st.integers(0, 9), max_size=3), max_size=4)  # ragged nesting
                | st.lists(st.floats() | st.text(max_size=3) | st.none(), max_size=6)
            )
        elif kind == "binary_data_size":
            if not isinstance(target.get("parameters"), dict):
                target["parameters"] = {}
            target["parameters"]["binary_data_size"] = draw(
                edge_integers | st.booleans() | st.floats() | st.text(max_size=3)
            )
        elif kind == "parameters":
            target["parameters"] = draw(json_values)
        elif kind == "request_parameters":
            document["parameters"] = draw(
                json_values | st.fixed_dictionaries({"binary_data_output": json_values})
            )
        elif kind == "outputs":
            document["outputs"] = draw(
                json_values
                | st.lists(
                    st.fixed_dictionaries({"name": json_values, "parameters": json_values}), max_size=3
                )
            )
        elif kind == "id":
            document["id"] = draw(json_values)
        elif kind == "drop_key":
            target.pop(draw(st.sampled_from(["name", "datatype", "shape", "data", "parameters"])), None)
        elif kind == "duplicate":
            inputs.append(copy.deepcopy(target))
        elif kind == "binary_tail":
            cut = draw(st.integers(0, len(binary)))
            binary = binary[:cut] + draw(st.binary(max_size=16))
        elif kind == "inputs":
            document["inputs"] = draw(json_values)
        header = json.dumps(document).encode()
        if kind == "header_length":
            header_length = draw(st.sampled_from([0, -1, len(header) - 1, len(header) + 1]) | edge_integers)

    header = json.dumps(document).encode()
    if header_length is None and binary:
        header_length = len(header)
    return header + binary, header_length


# A configuration that uses most of what the validator checks, beside the repository's own.
RICH = """
name: "rich"
backend: "python"
max_batch_size: 4
input [ { name: "A" data_type: TYPE_FP32 dims: [ 2, 3 ] reshape { shape: [ 6 ] } },
        { name: "B" data_type: TYPE_STRING dims: [ -1 ] optional: true } ]
output [ { name: "C" data_type: TYPE_INT64 dims: [ -1, 2 ] } ]
version_policy { specific { versions: [ 1, 3 ] } }
instance_group [ { count: 2 kind: KIND_CPU }, { kind: KIND_GPU gpus: [ 0 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
                  { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] } ]
  state [ { input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_FP32 dims: [ 4 ]
            initial_state { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true name: "zero" } } ]
  oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2 ] }
}
parameters { key: "k" value: { string_value: "v" } }
model_warmup [ { name: "w" batch_size: 1 inputs { key: "A" value: { data_type: TYPE_FP32 dims: [ 2, 3 ] zero_data: true } } } ]
"""
DYNAMIC = """
name: "dynamic" platform: "onnxruntime_onnx" max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP16 dims: [ -1 ] } ] output [ { name: "y" data_type: TYPE_BF16 dims: [ 1 ] } ]
dynamic_batching { preferred_batch_size: [ 2, 4 ] max_queue_delay_microseconds: 100
                   priority_levels: 2 default_priority_level: 1
                   priority_queue_policy { key: 2 value: { max_queue_size: 3 } } }
"""
_REPOSITORY_CONFIGS = sorted(
    path.read_text() for root in (EXAMPLES, TESTS) for path in Path(root).rglob("config.pbtxt")
)
SEEDS = [RICH, DYNAMIC, *_REPOSITORY_CONFIGS]
# Pieces of the text format: what a hand edit or a truncated copy leaves in a config.
TOKENS = st.sampled_from(
    [
        "{", "}", "[", "]", ":", ",", '"', "#", "\n", "-1", "0", "99", "9223372036854775808",
        "1e400", "nan", "TYPE_FP32", "TYPE_INVALID", "TYPE_STRING", "dims", "input", "output",
        "name", "data_type", "max_batch_size", "reshape", "shape", "optional", "instance_group",
        "count", "kind", "KIND_GPU", "gpus", "dynamic_batching", "sequence_batching", "state",
        "control_input", "control", "ensemble_scheduling", "step", "platform", '"ensemble"',
        "version_policy", "specific", "versions", "latest", "num_versions", "data_type: 99",
        "parameters", "key", "value", "string_value", "\\", "\x00", "é",
    ]
)  # fmt: skip


@st.composite
def config_documents(draw: st.DrawFn) -> Any:
    """The JSON form of a real configuration with some values swapped for arbitrary JSON."""
    document = config_to_dict(parse_config(draw(st.sampled_from(SEEDS))))
    for _ in range(draw(st.integers(1, 3))):
        node: Any = document
        while isinstance(node, dict | list) and node and draw(st.booleans()):
            key = (
                draw(st.sampled_from(sorted(node)))
                if isinstance(node, dict)
                else draw(st.integers(0, len(node) - 1))
            )
            if not isinstance(node[key], dict | list) or not node[key]:
                break
            node = node[key]
        if isinstance(node, dict) and node:
            node[draw(st.sampled_from(sorted(node)))] = draw(json_values)
        elif isinstance(node, list) and node:
            node[draw(st.integers(0, len(node) - 1))] = draw(json_values)
    return document
