"""Reading `config.pbtxt` (protobuf text format) into the model-config message."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from google.protobuf import text_format

from coreserve.errors import ModelConfigError
from coreserve.protos.model_config_pb2 import ModelConfig

__all__ = ["ModelConfig", "parse_config", "read_config_file"]

_INT32_LIMIT = 2**31


def _integer_out_of_range(match: re.Match[str], _line: str) -> str:
    # C++ stops at the sign of a negative number for an unsigned field (any negative number that
    # a signed field of 32 bits or more would take); it names the digits of one too large.
    if match[1] and int(match[2]) <= _INT32_LIMIT:
        return "Expected integer, got: -"
    return f"Integer out of range ({match[2]})"


def _unknown_enum_value(match: re.Match[str], line: str) -> str:
    field = re.search(rf"(\w+)\s*:\s*{match[1]}\b", line)
    return f'Unknown enumeration value of "{match[1]}" for field "{field[1] if field else "?"}".'


# Python's texts for a value that does not fit its field, and the C++ parser's (Triton's) words.
_TRITON_WORDS: list[tuple[re.Pattern[str], Callable[[re.Match[str], str], str]]] = [
    (re.compile(r"Couldn't parse integer: (.*)"), lambda match, _: f"Expected integer, got: {match[1]}"),
    (re.compile(r"Value out of range: (-?)(\d+)"), _integer_out_of_range),
    (re.compile(r"Expected string but found: '(.*)'"), lambda match, _: f"Expected string, got: {match[1]}"),
    (re.compile(r'Enum type "[\w.]+" has no value named (\w+)\.'), _unknown_enum_value),
]


def _in_triton_words(message: str) -> str:
    """A text-format parse error ("L:C : 'line': what") with what is wrong in the words of
    Triton's C++ parser where they differ (its QA greps for them: "Expected integer, got: -")."""
    place, separator, what = message.rpartition("': ")
    for pattern, words in _TRITON_WORDS:
        match = pattern.fullmatch(what)
        if match is not None:
            return place + separator + words(match, place)
    return message


def parse_config(text: str, source: str = "config.pbtxt") -> ModelConfig:
    """Parses configuration text; a syntax error or unknown field names `source` and the line."""
    try:
        return text_format.Parse(text, ModelConfig())
    except text_format.ParseError as exc:
        raise ModelConfigError(f"{source}: {_in_triton_words(str(exc))}") from None
    except ValueError as exc:  # protobuf refuses some values only when it sets them (an enum past int32)
        raise ModelConfigError(f"{source}: {exc}") from None


def read_config_file(path: Path) -> ModelConfig:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ModelConfigError(f"{path}: not UTF-8 text ({exc})") from None
    return parse_config(text, source=str(path))
