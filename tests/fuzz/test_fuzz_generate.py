"""Fuzzing the generate extension's request codec: flat JSON fitted to a model's inputs."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from coreserve.config import ModelSignature, parse_config, validate_config
from coreserve.errors import InvalidArgumentError, ModelConfigError
from coreserve.protocol.generate import decode_generate_request
from fuzz_support import DATATYPES, client_error_or_answer, element_values, json_values


@st.composite
def signatures(draw: st.DrawFn) -> ModelSignature:
    """A valid model signature: one or two inputs of any datatype and dims, batching or not."""
    inputs = []
    for index in range(draw(st.integers(1, 2))):
        datatype = draw(st.sampled_from(DATATYPES))
        dims = draw(st.lists(st.sampled_from([-1, 1, 2, 3, 2**40]), min_size=1, max_size=3))
        inputs.append(f'{{ name: "IN{index}" data_type: {datatype.config_name} dims: {dims} }}')
    text = (
        f'name: "g" max_batch_size: {draw(st.sampled_from([0, 4]))} '
        f"input [ {', '.join(inputs)} ] "
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]'
    )
    config = parse_config(text)
    try:
        validate_config(config)
    except ModelConfigError:
        assume(False)
    return ModelSignature(config)


@st.composite
def generate_bodies(draw: st.DrawFn, signature: ModelSignature) -> bytes:
    document: dict[str, Any] = {}
    for name, spec in signature.inputs.items():
        if draw(st.integers(0, 4)) == 0:
            continue
        document[name] = draw(
            element_values(spec.datatype)
            | st.lists(element_values(spec.datatype), max_size=8)
            | st.lists(st.lists(element_values(spec.datatype), max_size=3), max_size=3)
            | json_values
        )
    if draw(st.booleans()):
        document[draw(st.sampled_from(["id", "parameters", "OTHER"]))] = draw(json_values)
    return json.dumps(document).encode()


def _decode_and_check(signature: ModelSignature, body: bytes) -> None:
    request = client_error_or_answer(lambda: decode_generate_request(body, signature, "g", "1"))
    if request is not None:
        client_error_or_answer(lambda: signature.check_request(request))


@given(st.data())
def test_generate_bodies_get_a_client_error_or_a_request(data: st.DataObject) -> None:
    signature = data.draw(signatures())
    _decode_and_check(signature, data.draw(generate_bodies(signature) | st.binary(max_size=32)))


def test_generate_dims_past_numpys_limits_get_a_client_error() -> None:
    """Found by the fuzzer: a -1 filled in next to huge dims gave numpy's ValueError (a 500)."""
    config = (
        'name: "g" input [ { name: "IN0" data_type: TYPE_BOOL dims: [ -1, 1099511627776, 1099511627776 ] } ]'
    )
    with pytest.raises(InvalidArgumentError, match="input 'IN0' has a shape too large for any tensor"):
        decode_generate_request(b'{"IN0": []}', ModelSignature(parse_config(config)), "g", "1")
