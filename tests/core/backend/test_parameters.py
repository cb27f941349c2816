"""Config `parameters` read as numbers, flags and choices, with errors naming model and key."""

from __future__ import annotations

import pytest

from coreserve.backend import bool_parameter, choice_parameter, int_parameter, str_parameter
from coreserve.config import parse_config
from coreserve.errors import ModelConfigError


def _config(**parameters: str):
    entries = "".join(
        f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'
        for key, value in parameters.items()
    )
    return parse_config(f'name: "m"\n{entries}')


def test_values_are_read_and_missing_keys_are_none() -> None:
    config = _config(threads=" 4 ", spin="Yes", hint="throughput", name="x")
    assert int_parameter(config, "threads") == 4
    assert bool_parameter(config, "spin") is True
    assert choice_parameter(config, "hint", ("LATENCY", "THROUGHPUT")) == "THROUGHPUT"
    assert str_parameter(config, "name") == "x"
    for read in (str_parameter, int_parameter, bool_parameter):
        assert read(config, "absent") is None
    assert choice_parameter(config, "absent", ("a",)) is None


@pytest.mark.parametrize(
    ("read", "value", "message"),
    [
        (int_parameter, "four", "model 'm': parameter 'p' must be an integer, got 'four'"),
        (int_parameter, "-1", "model 'm': parameter 'p' must be >= 0, got -1"),
        (bool_parameter, "maybe", "model 'm': parameter 'p' must be true or false, got 'maybe'"),
        (
            lambda config, key: choice_parameter(config, key, ("f32", "bf16")),
            "f8",
            "model 'm': parameter 'p' must be one of f32, bf16, got 'f8'",
        ),
    ],
)
def test_bad_values_name_the_model_and_the_key(read, value: str, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ModelConfigError) as info:
        read(_config(p=value), "p")
    assert str(info.value) == message
