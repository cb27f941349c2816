"""Reading a model configuration's `parameters` (string values) as numbers and flags.

Errors name the model and the parameter, so that every backend reports bad values the same way.
"""

from __future__ import annotations

from coreserve.errors import ModelConfigError
from coreserve.protos.model_config_pb2 import ModelConfig

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def str_parameter(config: ModelConfig, key: str) -> str | None:
    entry = config.parameters.get(key)
    return entry.string_value.strip() if entry is not None else None


def int_parameter(config: ModelConfig, key: str, minimum: int = 0) -> int | None:
    value = str_parameter(config, key)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise ModelConfigError(
            f"model '{config.name}': parameter '{key}' must be an integer, got '{value}'"
        ) from None
    if number < minimum:
        raise ModelConfigError(f"model '{config.name}': parameter '{key}' must be >= {minimum}, got {number}")
    return number


def bool_parameter(config: ModelConfig, key: str) -> bool | None:
    value = str_parameter(config, key)
    if value is None:
        return None
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ModelConfigError(f"model '{config.name}': parameter '{key}' must be true or false, got '{value}'")


def choice_parameter(config: ModelConfig, key: str, choices: tuple[str, ...]) -> str | None:
    """One of `choices`, matched without regard to case and returned as spelled there."""
    value = str_parameter(config, key)
    if value is None:
        return None
    for choice in choices:
        if value.lower() == choice.lower():
            return choice
    raise ModelConfigError(
        f"model '{config.name}': parameter '{key}' must be one of {', '.join(choices)}, got '{value}'"
    )


def inline_below_us(config: ModelConfig) -> int | None:
    """Parameter `inline_execution_below_us` for InstanceThread (None: the default)."""
    return int_parameter(config, "inline_execution_below_us")
