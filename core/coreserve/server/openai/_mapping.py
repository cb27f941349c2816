"""OpenAI requests as model inputs, and model responses as text and token counts.

A model serves completions as Triton's OpenAI frontend expects: a `text_input` (BYTES) input
and a `text_output` (BYTES) output. Each sampling option (`max_tokens`, `temperature`, `top_p`,
`stop`, `seed`…) goes to the input of the same name, in that input's datatype and dims, as the
model's configuration declares it; an option the model has no input for is refused (400),
never dropped, unless the model takes a BYTES `sampling_parameters` input: then, as Triton's
frontend does for vLLM models, the options it has no input for travel there as one JSON object.
A model with a BOOL `stream` input is told whether the client streams, and the vLLM backend's
BOOL inputs `exclude_input_in_output`, `return_num_input_tokens` and `return_num_output_tokens`
are set to true where a model has them. Usage is read from `num_input_tokens` and
`num_output_tokens` outputs (the vLLM backend's names); decoupled models send one response per
chunk of text.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from coreserve.config import ModelSignature
from coreserve.config.signature import TensorSpec
from coreserve.errors import InvalidArgumentError
from coreserve.protocol.tensors import array_from_json
from coreserve.server.openai._errors import OptionError
from coreserve.types import DataType, InferenceRequest, InferenceResponse

TEXT_INPUT = "text_input"
TEXT_OUTPUT = "text_output"
STREAM_INPUT = "stream"
INPUT_TOKENS = "num_input_tokens"
OUTPUT_TOKENS = "num_output_tokens"
EMBEDDING_OUTPUT = "embedding"
SAMPLING_PARAMETERS = "sampling_parameters"
# The vLLM backend's switches, all set to true: the answer without the prompt, with its counts.
_TRUE_SWITCHES = ("exclude_input_in_output", "return_num_input_tokens", "return_num_output_tokens")
# Inputs the frontend fills itself: an option of one of these names is not the model's to take.
_FRONTEND_INPUTS = (TEXT_INPUT, STREAM_INPUT, SAMPLING_PARAMETERS, *_TRUE_SWITCHES)


def check_text_model(name: str, signature: ModelSignature) -> None:
    """Refuses a model that cannot serve text generation."""
    text_input = signature.inputs.get(TEXT_INPUT)
    if (
        text_input is None
        or text_input.datatype is not DataType.BYTES
        or TEXT_OUTPUT not in signature.outputs
    ):
        raise InvalidArgumentError(
            f"model '{name}' cannot generate text: it needs a BYTES input '{TEXT_INPUT}' and an "
            f"output '{TEXT_OUTPUT}'"
        )


def generation_inputs(
    name: str, signature: ModelSignature, prompt: str, options: dict[str, Any], stream: bool
) -> InferenceRequest:
    """The inference request for a prompt and its sampling options."""
    check_text_model(name, signature)
    batching = signature.batching
    inputs = {TEXT_INPUT: _tensor(TEXT_INPUT, prompt, signature.inputs[TEXT_INPUT], batching)}
    for switch, on in ((STREAM_INPUT, stream), *((switch, True) for switch in _TRUE_SWITCHES)):
        spec = signature.inputs.get(switch)
        if spec is not None and spec.datatype is DataType.BOOL:
            inputs[switch] = _tensor(switch, on, spec, batching)
    sampling = signature.inputs.get(SAMPLING_PARAMETERS)
    if sampling is not None and sampling.datatype is not DataType.BYTES:
        sampling = None
    rest = {}  # the options that travel in sampling_parameters
    for key, value in options.items():
        spec = None if key in _FRONTEND_INPUTS else signature.inputs.get(key)
        if spec is not None:
            inputs[key] = _tensor(key, value, spec, batching)
        elif sampling is not None:
            rest[key] = value
        else:
            takes = sorted(k for k in signature.inputs if k not in _FRONTEND_INPUTS)
            raise OptionError(
                key,
                f"model '{name}' does not support option '{key}' (the options it takes: "
                f"{', '.join(takes) or 'none'})",
            )
    if sampling is not None:
        inputs[SAMPLING_PARAMETERS] = _tensor(SAMPLING_PARAMETERS, json.dumps(rest), sampling, batching)
    return InferenceRequest(model_name=name, inputs=inputs)


def embedding_inputs(name: str, signature: ModelSignature, text: str) -> InferenceRequest:
    """The inference request for one text to embed."""
    spec = signature.inputs.get(TEXT_INPUT)
    if spec is None or spec.datatype is not DataType.BYTES or embedding_output(signature) is None:
        raise InvalidArgumentError(
            f"model '{name}' cannot embed text: it needs a BYTES input '{TEXT_INPUT}' and a "
            f"floating-point output '{EMBEDDING_OUTPUT}'"
        )
    return InferenceRequest(
        model_name=name, inputs={TEXT_INPUT: _tensor(TEXT_INPUT, text, spec, signature.batching)}
    )


def embedding_output(signature: ModelSignature) -> str | None:
    """The output holding a model's embedding: `embedding`, or its only floating-point output."""
    floats = [s.name for s in signature.outputs.values() if s.datatype in _FLOAT_TYPES]
    if EMBEDDING_OUTPUT in floats:
        return EMBEDDING_OUTPUT
    return floats[0] if len(floats) == 1 else None


_FLOAT_TYPES = (DataType.FP16, DataType.FP32, DataType.FP64, DataType.BF16)


@dataclass
class Chunk:
    """What one model response says: its text, and the token counts it reports (None if not)."""

    text: str
    input_tokens: int | None
    output_tokens: int | None


def read_chunk(response: InferenceResponse) -> Chunk:
    outputs = response.outputs
    text = ""
    array = outputs.get(TEXT_OUTPUT)
    if array is not None and array.size:
        value = array.reshape(-1)[0]
        text = value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)
    return Chunk(text, _count(outputs.get(INPUT_TOKENS)), _count(outputs.get(OUTPUT_TOKENS)))


def _count(array: np.ndarray | None) -> int | None:
    if array is None or not array.size or array.dtype.kind not in "iu":
        return None
    return int(array.reshape(-1)[0])


def _tensor(key: str, value: Any, spec: TensorSpec, batching: bool) -> np.ndarray:
    """`value` (a scalar or a list) as the input `spec` declares it, -1 dims fitted to it."""
    values = value if isinstance(value, list) else [value]
    count = len(values)
    dims = list(spec.dims)
    known = math.prod(d for d in dims if d != -1)
    if -1 in dims:
        first = dims.index(-1)
        dims = [1 if d == -1 else d for d in dims]
        if known and count % known == 0:
            dims[first] = count // known
    if math.prod(dims) != count:
        raise OptionError(
            key, f"option '{key}' takes {math.prod(dims)} value(s) here (dims {list(spec.dims)}), got {count}"
        )
    shape = tuple([1, *dims] if batching else dims)
    try:
        return array_from_json(values, spec.datatype, shape, key)
    except InvalidArgumentError as exc:
        raise OptionError(key, f"option '{key}': {exc.message}") from None
