"""Fuzzing the model configuration reader: config.pbtxt text and the JSON form of the load API.

What the repository does with a configuration (parse, fill defaults, validate, build the
request signature, render /config) either succeeds or raises ModelConfigError with a
message; never KeyError, IndexError, ValueError or RecursionError.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from coreserve.config import (
    ModelConfig,
    ModelSignature,
    apply_defaults,
    config_from_dict,
    config_to_dict,
    parse_config,
    validate_config,
)
from coreserve.errors import ModelConfigError
from fuzz_support import json_values
from paths import EXAMPLES, TESTS

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
SEEDS = [RICH, DYNAMIC] + sorted(
    path.read_text() for root in (EXAMPLES, TESTS) for path in Path(root).rglob("config.pbtxt")
)
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
def mutated_configs(draw: st.DrawFn) -> str:
    """A real configuration with up to four edits: cuts, duplicated slices, inserted tokens."""
    text = draw(st.sampled_from(SEEDS))
    for _ in range(draw(st.integers(1, 4))):
        start = draw(st.integers(0, len(text)))
        end = draw(st.integers(start, min(len(text), start + 40)))
        edit = draw(st.sampled_from(["cut", "duplicate", "insert", "replace"]))
        if edit == "cut":
            text = text[:start] + text[end:]
        elif edit == "duplicate":
            text = text[:end] + text[start:end] + text[end:]
        elif edit == "insert":
            text = text[:start] + " " + draw(TOKENS) + " " + text[start:]
        else:
            text = text[:start] + draw(TOKENS) + text[end:]
    return text


# protobuf's text parser hands string escapes to Python's unicode_escape codec, which warns
# about an unknown escape such as '\ ' and keeps the characters: a parse that succeeds (the
# server does not turn warnings into errors, as this suite does).
unknown_escapes_are_kept = pytest.mark.filterwarnings(
    "ignore:decoding with 'unicode_escape' codec failed:DeprecationWarning",
    "ignore:invalid escape sequence:DeprecationWarning",
)


def _load_like_the_repository(config: ModelConfig) -> None:
    """The steps a configuration goes through when its model loads, and /config's rendering."""
    try:
        apply_defaults(config, config.name or "fuzzed")
        validate_config(config)
        ModelSignature(config)
        json.dumps(config_to_dict(config))
    except ModelConfigError as exc:
        assert exc.message.strip()


def _parse_and_load(text: str) -> None:
    try:
        config = parse_config(text, source="fuzzed/config.pbtxt")
    except ModelConfigError as exc:
        assert exc.message.startswith("fuzzed/config.pbtxt")
        return
    _load_like_the_repository(config)


@unknown_escapes_are_kept
@given(st.text(max_size=200))
@example("input [ { name: \"x\" data_type: 99 dims: [ 1 ] } ]")
@example("output [ { name: \"y\" data_type: TYPE_FP32 dims: [ 1 ] } ] " * 3)
@example("{" * 200)
def test_random_text_gets_a_config_error_or_a_config(text: str) -> None:
    _parse_and_load(text)


@unknown_escapes_are_kept
@given(mutated_configs())
@example('name: " \\ rich"')
@example('output [ { name: "y" data_type: 9223372036854775808 dims: [ 1 ] } ]')
@example(RICH.replace("data_type: TYPE_FP32 dims: [ 4 ]\n", "data_type: 99 dims: [ 4 ]\n"))
@example(RICH.replace("data_type: TYPE_UINT64", "data_type: 77"))
def test_mutated_configs_get_a_config_error_or_a_config(text: str) -> None:
    _parse_and_load(text)


@st.composite
def config_documents(draw: st.DrawFn) -> Any:
    """The JSON form of a real configuration with some values swapped for arbitrary JSON."""
    document = config_to_dict(parse_config(draw(st.sampled_from(SEEDS))))
    for _ in range(draw(st.integers(1, 3))):
        node: Any = document
        while isinstance(node, dict | list) and node and draw(st.booleans()):
            key = draw(st.sampled_from(sorted(node))) if isinstance(node, dict) else draw(
                st.integers(0, len(node) - 1)
            )
            if not isinstance(node[key], dict | list) or not node[key]:
                break
            node = node[key]
        if isinstance(node, dict) and node:
            node[draw(st.sampled_from(sorted(node)))] = draw(json_values)
        elif isinstance(node, list) and node:
            node[draw(st.integers(0, len(node) - 1))] = draw(json_values)
    return document


@given(config_documents() | json_values)
def test_json_configs_get_a_config_error_or_a_config(document: Any) -> None:
    if not isinstance(document, dict):
        return  # the HTTP and gRPC frontends refuse a non-object config before parsing it
    try:
        config = config_from_dict(document, source="load request")
    except ModelConfigError as exc:
        assert exc.message.startswith("load request")
        return
    _load_like_the_repository(config)
