"""Model configuration: `config.pbtxt` parsing, defaults, validation, JSON form and signatures.

`ModelConfig` is the generated protobuf message, so any configuration Triton accepts parses
here too. Validation raises `ModelConfigError` with a message naming the model and the field.

Layer 1: may import coreserve's errors, types and generated protos only.
"""

from __future__ import annotations

from coreserve.config._defaults import SEQUENCE_IDLE_DEFAULT_US, apply_defaults
from coreserve.config._validate import validate_config
from coreserve.config.json import config_from_dict, config_to_dict
from coreserve.config.parse import ModelConfig, parse_config, read_config_file
from coreserve.config.signature import ModelSignature, TensorSpec

__all__ = [
    "SEQUENCE_IDLE_DEFAULT_US",
    "ModelConfig",
    "ModelSignature",
    "TensorSpec",
    "apply_defaults",
    "config_from_dict",
    "config_to_dict",
    "parse_config",
    "read_config_file",
    "validate_config",
]
