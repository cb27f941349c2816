"""Triton's generate extension: flat JSON in, flat JSON out (and server-sent events).

A request is a JSON object whose keys are input names (plus `id` and `parameters`); a value
is a scalar or a list, fitted to the input's dims. A response names each output with its
value: a scalar when it holds one element, else a flat list; BYTES become text.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import orjson

from coreserve.config.signature import ModelSignature, TensorSpec
from coreserve.errors import InvalidArgumentError
from coreserve.protocol.http_body import parse_parameters
from coreserve.protocol.tensors import array_from_json, array_to_json, check_shape
from coreserve.types import DataType, InferenceRequest, InferenceResponse

RESERVED_KEYS = ("id", "parameters")


def decode_generate_request(
    body: bytes, signature: ModelSignature, model_name: str, model_version: str
) -> InferenceRequest:
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidArgumentError(f"malformed JSON in the generate request: {exc}") from None
    if not isinstance(document, dict):
        raise InvalidArgumentError("the generate request must be a JSON object")
    inputs = {}
    for key, value in document.items():
        if key in RESERVED_KEYS:
            continue
        spec = signature.inputs.get(key)
        if spec is None:
            raise InvalidArgumentError(
                f"unexpected input '{key}' for model '{model_name}'; "
                f"its inputs are {sorted(signature.inputs)}"
            )
        inputs[key] = _fit(value, spec, signature.batching)
    request_id = document.get("id", "")
    if not isinstance(request_id, str):
        raise InvalidArgumentError("request 'id' must be a string")
    return InferenceRequest(
        model_name=model_name,
        model_version=model_version,
        id=request_id,
        inputs=inputs,
        parameters=parse_parameters(document.get("parameters"), "the request"),
    )


def _fit(value: Any, spec: TensorSpec, batching: bool) -> np.ndarray:
    values = value if isinstance(value, list) else [value]
    count = len(values)
    dims = list(spec.dims)
    known = math.prod(d for d in dims if d != -1)
    if dims.count(-1) == 1 and known and count % known == 0:
        dims[dims.index(-1)] = count // known
    elif dims.count(-1) > 1 or math.prod(dims) != count:
        raise InvalidArgumentError(
            f"input '{spec.name}' has {count} values, which do not fit its dims {list(spec.dims)}"
        )
    # The dims come from the model's configuration, which may ask for more than numpy holds.
    shape = check_shape(tuple([1, *dims] if batching else dims), spec.name)
    return array_from_json(values, spec.datatype, shape, spec.name)


def encode_generate_response(response: InferenceResponse) -> bytes:
    document: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        document["id"] = response.id
    for name, array in response.outputs.items():
        data = array_to_json(array, DataType.from_numpy(array.dtype), name)
        values = data.tolist() if isinstance(data, np.ndarray) else data
        document[name] = values[0] if len(values) == 1 else values
    if response.parameters:
        document["parameters"] = response.parameters
    return orjson.dumps(document)
