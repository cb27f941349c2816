"""The request parameters Triton's frontends read themselves, checked as they check them.

`sequence_id`, `sequence_start`, `sequence_end`, `priority` and `timeout` are a request's own
fields in Triton (`coreserve.types.REQUEST_FIELDS`), `binary_data_output` is HTTP's, and keys
starting with `triton_` are Triton's to give. A value of the wrong type is refused in the words of
Triton's HTTP frontend (RapidJSON's, which it answers with a 500: a client's mistake is a 400
here) or of its gRPC frontend (INVALID_ARGUMENT).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from coreserve.errors import InvalidArgumentError, quoted_value


def _unsigned(value: object) -> bool:
    return type(value) is int and 0 <= value < 2**64


def _boolean(value: object) -> bool:
    return type(value) is bool


# HTTP: each key's test, RapidJSON's words for a value that fails it, and what the value is.
_HTTP_CHECKS: dict[str, tuple[Callable[[object], bool], str, str]] = {
    "sequence_id": (
        lambda value: _unsigned(value) or isinstance(value, str),
        "attempt to access JSON non-string as string",
        "a sequence id is an integer >= 0 or a string",
    ),
    "sequence_start": (_boolean, "attempt to access JSON non-boolean as boolean", "true or false"),
    "sequence_end": (_boolean, "attempt to access JSON non-boolean as boolean", "true or false"),
    "priority": (
        _unsigned,
        "attempt to access JSON non-unsigned-integer as unsigned-integer",
        "a priority is an integer >= 0, 0 for the model's default",
    ),
    "timeout": (
        _unsigned,
        "attempt to access JSON non-unsigned-integer as unsigned-integer",
        "a timeout is an integer of microseconds >= 0",
    ),
    "binary_data_output": (_boolean, "attempt to access JSON non-boolean as boolean", "true or false"),
}


def check_http_parameters(parameters: Mapping[str, Any]) -> None:
    """Refuses what Triton's HTTP frontend refuses in a request's `parameters`."""
    for key, value in parameters.items():
        check = _HTTP_CHECKS.get(key)
        if check is None:
            if key.startswith("triton_"):
                raise InvalidArgumentError(
                    "parameter keys starting with 'triton_' are reserved for Triton usage and should not be "
                    f"specified. (got '{key}')"
                )
            continue
        accepts, words, what = check
        if not accepts(value):
            raise InvalidArgumentError(
                f"Unable to parse '{key}': {words} (got {quoted_value(value)}; {what})"
            )


# gRPC: the types each may have; any other key takes these, and no other key may start with `triton_`.
_GRPC_TYPES = {
    "sequence_id": ("int64_param", "string_param"),
    "sequence_start": ("bool_param",),
    "sequence_end": ("bool_param",),
    "priority": ("int64_param", "uint64_param"),
    "timeout": ("int64_param",),
    "triton_enable_empty_final_response": ("bool_param",),
}
_GRPC_OTHER_TYPES = ("int64_param", "bool_param", "string_param", "double_param")


def check_grpc_parameters(given: Any) -> None:
    """Refuses what Triton's gRPC frontend refuses in a request's `parameters` map."""
    for key, parameter in given.items():
        if key.startswith("triton_") and key not in _GRPC_TYPES:
            raise InvalidArgumentError(
                "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following "
                "keys starting with 'triton_' are allowed: triton_enable_empty_final_response"
            )
        allowed = _GRPC_TYPES.get(key, _GRPC_OTHER_TYPES)
        if parameter.WhichOneof("parameter_choice") not in allowed:
            # (Triton's text for the other keys leaves out the double it takes)
            typed = allowed is not _GRPC_OTHER_TYPES
            expected = " or ".join(allowed) if typed else "int64_param, bool_param, or string_param"
            raise InvalidArgumentError(f"invalid value type for '{key}' parameter, expected {expected}.")
    if "priority" in given and given["priority"].int64_param < 0:
        priority = given["priority"].int64_param
        raise InvalidArgumentError(f"invalid value for 'priority', expected value >= 0. (got {priority})")
