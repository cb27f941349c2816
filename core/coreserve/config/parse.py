"""Reading `config.pbtxt` (protobuf text format) into the model-config message."""

from __future__ import annotations

from pathlib import Path

from google.protobuf import text_format

from coreserve.errors import ModelConfigError
from coreserve.protos.model_config_pb2 import ModelConfig

__all__ = ["ModelConfig", "parse_config", "read_config_file"]


def parse_config(text: str, source: str = "config.pbtxt") -> ModelConfig:
    """Parses configuration text; a syntax error or unknown field names `source` and the line."""
    try:
        return text_format.Parse(text, ModelConfig())
    except text_format.ParseError as exc:
        raise ModelConfigError(f"{source}: {exc}") from None
    except ValueError as exc:  # protobuf refuses some values only when it sets them (an enum past int32)
        raise ModelConfigError(f"{source}: {exc}") from None


def read_config_file(path: Path) -> ModelConfig:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ModelConfigError(f"{path}: not UTF-8 text ({exc})") from None
    return parse_config(text, source=str(path))
