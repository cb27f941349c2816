"""Triton's generate extension: flat JSON in, flat JSON out (and server-sent events).

A request is a JSON object. As in Triton, a key that names a model input is that input (a
scalar or a list, fitted to the input's dims); every other key is a request parameter, so
sampling options such as `"max_tokens": 16` or `"temperature": 0.7` reach the model (a Python
model reads them with `request.parameters()`). The entries of a `"parameters"` object are request
parameters too; where a name comes twice, the later one in the document wins. A parameter is a
string, an integer, a float or a boolean. `"id"`, a string, is the request's id (and, as in
Triton, a parameter as well).

A response names each output with its value: a scalar when it holds one element, else a flat
list; BYTES become text.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from coreserve.config.signature import ModelSignature, TensorSpec
from coreserve.errors import InvalidArgumentError
from coreserve.protocol.tensors import array_from_json, array_to_json, check_shape, json_loads
from coreserve.types import DataType, InferenceRequest, InferenceResponse, ParameterValue

PARAMETERS_KEY = "parameters"
# Triton's words for a value that cannot be a parameter (it takes floats too, as we do).
_INVALID_TYPE = "parameter '{}' has invalid type. It should be either 'int', 'bool', or 'string'."
_INT64 = (-(2**63), 2**63 - 1)


@dataclass(slots=True)
class GenerateDocument:
    """A generate request body, parsed (it pickles cheaply: a worker process may parse it)."""

    inputs: dict[str, np.ndarray]
    parameters: dict[str, ParameterValue]
    id: str

    def request(self, model_name: str, model_version: str) -> InferenceRequest:
        return InferenceRequest(
            model_name=model_name,
            model_version=model_version,
            id=self.id,
            inputs=self.inputs,
            parameters=self.parameters,
        )


def decode_generate_request(
    body: bytes | bytearray, signature: ModelSignature, model_name: str, model_version: str
) -> InferenceRequest:
    """Decodes a generate request body: model inputs by name, every other key a parameter."""
    return parse_generate_document(body, signature.inputs, signature.batching).request(
        model_name, model_version
    )


def parse_generate_document(
    body: bytes | bytearray | memoryview, specs: Mapping[str, TensorSpec], batching: bool
) -> GenerateDocument:
    """Parses a generate request body for a model of inputs `specs` (`batching`: it batches)."""
    try:
        document = json_loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidArgumentError(f"malformed JSON in the generate request: {exc}") from None
    if not isinstance(document, dict):
        raise InvalidArgumentError("the generate request must be a JSON object")
    _refuse_duplicate_inputs(body, specs)
    inputs = {}
    parameters: dict[str, ParameterValue] = {}
    for key, value in document.items():
        spec = specs.get(key)
        if spec is not None:
            inputs[key] = _fit(value, spec, batching)
        elif key == PARAMETERS_KEY:
            if not isinstance(value, dict):
                raise InvalidArgumentError(
                    f"Expected JSON object for keyword: '{PARAMETERS_KEY}' (got {_json_type(value)})"
                )
            for name, item in value.items():
                parameters[name] = _parameter(name, item, f"Converting keyword: '{PARAMETERS_KEY}': ")
        else:
            parameters[key] = _parameter(key, value)
    request_id = "" if "id" in specs else document.get("id", "")
    if not isinstance(request_id, str):
        raise InvalidArgumentError(
            f"Unable to parse 'id': request 'id' must be a string, got {_json_type(request_id)}"
        )
    return GenerateDocument(inputs, parameters, request_id)


def _parameter(name: str, value: Any, prefix: str = "") -> ParameterValue:
    """A JSON value as a request parameter, with Triton's words when it cannot be one."""
    if isinstance(value, bool | str | float):
        return value
    if isinstance(value, int):
        # Triton holds integers as int64; beyond that range it passes the number as a double.
        return value if _INT64[0] <= value <= _INT64[1] else float(value)
    raise InvalidArgumentError(
        prefix + _INVALID_TYPE.format(name) + f" (coreserve takes a number too; got {_json_type(value)})"
    )


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "an object"
    return "an array" if isinstance(value, list) else type(value).__name__


def _refuse_duplicate_inputs(body: bytes | bytearray | memoryview, specs: Mapping[str, TensorSpec]) -> None:
    """Refuses an input named twice, as Triton does (a JSON parser keeps one of the two): the
    first name seen again, in Triton's words. The document is read again, key by key, only
    where an input's quoted name occurs twice in it, or a \\u escape may spell one."""
    data = bytes(body)
    if b"\\u" not in data and not any(data.count(b'"' + name.encode() + b'"') > 1 for name in specs):
        return
    keys: list[list[str]] = []

    def keep_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys.append([key for key, _ in pairs])
        return dict(pairs)

    try:
        json.loads(data, object_pairs_hook=keep_keys)
    except (RecursionError, ValueError):  # nested deeper than this parser goes (orjson read it)
        return
    seen: set[str] = set()
    for key in keys[-1]:  # (the outermost object is the last one parsed)
        if key in seen and key in specs:
            raise InvalidArgumentError(f"input '{key}' already exists in request")
        seen.add(key)


def _fit(value: Any, spec: TensorSpec, batching: bool) -> np.ndarray:
    """The value as the input's tensor, shaped as Triton shapes it: its model metadata's shape
    (the batch dimension first where the model batches), whose fixed dimensions take their share
    of the values; the innermost variable one takes what is left, any other variable one is 1."""
    values = value if isinstance(value, list) else [value]
    shape = [-1, *spec.dims] if batching else list(spec.dims)
    known = math.prod(dim for dim in shape if dim != -1)
    variable = [index for index, dim in enumerate(shape) if dim == -1]
    for index in variable:
        shape[index] = 1
    if variable and known and len(values) % known == 0:
        shape[variable[-1]] = len(values) // known
    elif math.prod(shape) != len(values):
        raise InvalidArgumentError(
            f"The schema can not convert input '{spec.name}' to tensor with proper shape: "
            f"{len(values)} values do not fit its dims {list(spec.dims)}"
            + (" after the batch dimension" if batching else "")
        )
    # The dims come from the model's configuration, which may ask for more than numpy holds.
    return array_from_json(values, spec.datatype, check_shape(tuple(shape), spec.name), spec.name)


def encode_generate_response(response: InferenceResponse) -> bytes:
    """The response as Triton 2.51 writes it: one object of its id, model name and version, its
    parameters and its outputs, each under its own name (the first of two of the same name
    wins), with the names sorted."""
    document: dict[str, Any] = {"id": response.id} if response.id else {}
    document["model_name"] = response.model_name
    document["model_version"] = response.model_version
    for name, value in response.parameters.items():
        document.setdefault(name, value)
    for name, array in response.outputs.items():
        if name not in document:
            data = array_to_json(array, DataType.from_numpy(array.dtype), name, single=True)
            document[name] = data.tolist() if isinstance(data, np.ndarray) else data
    return orjson.dumps(document, option=orjson.OPT_SORT_KEYS)
