"""OpenAI options as model inputs: each in its input's datatype and dims, or refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest

from coreserve.config import ModelSignature, parse_config
from coreserve.server.openai._errors import OptionError
from coreserve.server.openai._mapping import generation_inputs, read_chunk
from coreserve.types import InferenceResponse

CONFIG = """
name: "lm"
backend: "python"
max_batch_size: {batch}
input [
  {{ name: "text_input" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] optional: true }},
  {{ name: "temperature" data_type: TYPE_FP32 dims: [ 1 ] optional: true }},
  {{ name: "stop" data_type: TYPE_STRING dims: [ -1 ] optional: true }},
  {{ name: "stream" data_type: TYPE_BOOL dims: [ 1 ] optional: true }}
]
output [ {{ name: "text_output" data_type: TYPE_STRING dims: [ 1 ] }} ]
"""


def _signature(batch: int = 0) -> ModelSignature:
    return ModelSignature(parse_config(CONFIG.format(batch=batch)))


def test_options_take_their_inputs_datatypes_and_dims() -> None:
    options = {"max_tokens": 5, "temperature": 0.5, "stop": ["\n", "."]}
    request = generation_inputs("lm", _signature(), "Hi", options, stream=True)
    inputs = request.inputs
    assert inputs["text_input"].tolist() == [b"Hi"]
    assert inputs["max_tokens"].dtype == np.int32 and inputs["max_tokens"].tolist() == [5]
    assert inputs["temperature"].dtype == np.float32 and inputs["temperature"].shape == (1,)
    assert inputs["stop"].tolist() == [b"\n", b"."]  # the -1 dim takes the list's length
    assert inputs["stream"].tolist() == [True]


def test_a_batching_model_gets_a_batch_of_one() -> None:
    request = generation_inputs("lm", _signature(batch=8), "Hi", {"stop": ["a", "b", "c"]}, stream=False)
    assert request.inputs["text_input"].shape == (1, 1)
    assert request.inputs["stop"].shape == (1, 3)


def test_an_option_without_an_input_is_refused_by_name() -> None:
    with pytest.raises(
        OptionError, match=r"does not support option 'top_p'.*max_tokens, stop, temperature"
    ) as found:
        generation_inputs("lm", _signature(), "Hi", {"top_p": 0.9}, stream=False)
    assert found.value.param == "top_p"
    # The inputs the frontend fills itself are not options a client may set.
    with pytest.raises(OptionError, match="does not support option 'text_input'"):
        generation_inputs("lm", _signature(), "Hi", {"text_input": "other"}, stream=False)


def test_a_value_the_input_cannot_hold_is_refused_by_name() -> None:
    with pytest.raises(OptionError, match="option 'max_tokens'") as found:
        generation_inputs("lm", _signature(), "Hi", {"max_tokens": [1, 2]}, stream=False)
    assert found.value.param == "max_tokens"


def test_read_chunk_takes_the_text_and_the_counts_where_given() -> None:
    outputs = {
        "text_output": np.array([["héllo".encode()]], dtype=object),
        "num_output_tokens": np.array([2], dtype=np.uint32),
    }
    chunk = read_chunk(InferenceResponse(model_name="lm", model_version="1", outputs=outputs))
    assert (chunk.text, chunk.input_tokens, chunk.output_tokens) == ("héllo", None, 2)


# The inputs of Triton's vLLM backend model (its model.json aside).
VLLM_CONFIG = """
name: "vllm_model"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [
  { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "stream" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
  { name: "sampling_parameters" data_type: TYPE_STRING dims: [ 1 ] optional: true },
  { name: "exclude_input_in_output" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
  { name: "return_num_input_tokens" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
  { name: "return_num_output_tokens" data_type: TYPE_BOOL dims: [ 1 ] optional: true }
]
output [
  { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] },
  { name: "num_input_tokens" data_type: TYPE_UINT32 dims: [ 1 ] },
  { name: "num_output_tokens" data_type: TYPE_UINT32 dims: [ 1 ] }
]
"""


def test_a_vllm_shaped_model_gets_its_options_as_sampling_parameters() -> None:
    signature = ModelSignature(parse_config(VLLM_CONFIG))
    options = {"max_tokens": 7, "temperature": 0.2, "stop": ["\n"], "sampling_parameters": "sneaky"}
    inputs = generation_inputs("vllm_model", signature, "Hi", options, stream=True).inputs
    assert json.loads(inputs["sampling_parameters"][0]) == options  # a client's own key is one option more
    assert {
        name: inputs[name].tolist() for name in inputs if name not in ("text_input", "sampling_parameters")
    } == {
        "stream": [True],
        "exclude_input_in_output": [True],
        "return_num_input_tokens": [True],
        "return_num_output_tokens": [True],
    }
