"""Fuzzing the model configuration reader: config.pbtxt text and the JSON form of the load API.

What the repository does with a configuration (parse, fill defaults, validate, build the
request signature, render /config) either succeeds or raises ModelConfigError with a
message; never KeyError, IndexError, ValueError or RecursionError.
"""

from __future__ import annotations

import json
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
from fuzz_support import RICH, SEEDS, TOKENS, config_documents, json_values


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
@example('input [ { name: "x" data_type: 99 dims: [ 1 ] } ]')
@example('output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ] ' * 3)
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
