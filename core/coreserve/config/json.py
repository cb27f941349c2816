"""The JSON form of a model configuration, as Triton's `/config` endpoint returns it.

protobuf's JSON mapping writes 64-bit integers as strings; Triton's output writes them as
numbers (`"dims": [16]`), and clients such as the Python backend's `model_config` rely on
that. Fields come in the order the schema declares them, as Triton writes them. The conversion
is guided by the message descriptor, so it follows the schema.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor

from coreserve.errors import ModelConfigError
from coreserve.protos.model_config_pb2 import ModelConfig

_INT64_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)


def config_to_dict(config: ModelConfig) -> dict[str, Any]:
    """The configuration as a JSON-ready dict: proto field names, defaults shown, ints as numbers."""
    data = json_format.MessageToDict(
        config, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    _int64_to_numbers(config.DESCRIPTOR, data)
    return data


def config_from_dict(data: dict[str, Any], source: str = "JSON configuration") -> ModelConfig:
    """Parses a JSON-shaped configuration (as clients send it to load a model)."""
    try:
        return json_format.ParseDict(_lists_where_repeated(ModelConfig.DESCRIPTOR, data), ModelConfig())
    except json_format.ParseError as exc:
        raise ModelConfigError(f"{source}: {exc}") from None


def _lists_where_repeated(descriptor: Any, data: Any) -> Any:
    """`data` with a single value of a repeated field made a list of one, as protobuf's C++ JSON
    parser (Triton's) takes it: `"instance_group": {...}` (Triton's QA L0_model_update sends it)."""
    if not isinstance(data, dict):
        return data
    fixed = dict(data)
    for name, value in data.items():
        field = descriptor.fields_by_name.get(name) or descriptor.fields_by_camelcase_name.get(name)
        if (
            value is None
            or field is None
            or (field.message_type and field.message_type.GetOptions().map_entry)
        ):
            continue  # (null: not set; unknown names and maps: ParseDict's to judge)
        if field.is_repeated and not isinstance(value, list):
            value = [value]
        if field.message_type is not None:
            inner = field.message_type
            value = (
                [_lists_where_repeated(inner, item) for item in value]
                if isinstance(value, list)
                else _lists_where_repeated(inner, value)
            )
        fixed[name] = value
    return fixed


def _int64_to_numbers(descriptor: Any, data: dict[str, Any]) -> None:
    """Rewrites, in place, the 64-bit integer fields of `descriptor`'s message as numbers, and
    puts the fields in their declared order."""
    ordered = {field.name: data[field.name] for field in descriptor.fields if field.name in data}
    if len(ordered) == len(data):
        data.clear()
        data.update(ordered)
    for name, value in data.items():
        field = descriptor.fields_by_name.get(name)
        if field is None:
            continue
        if field.message_type is not None:
            if field.message_type.GetOptions().map_entry:
                value_field = field.message_type.fields_by_name["value"]
                for key in value:
                    if value_field.message_type is not None:
                        _int64_to_numbers(value_field.message_type, value[key])
                    elif value_field.type in _INT64_TYPES:
                        value[key] = int(value[key])
            elif field.is_repeated:
                for item in value:
                    _int64_to_numbers(field.message_type, item)
            else:
                _int64_to_numbers(field.message_type, value)
        elif field.type in _INT64_TYPES:
            data[name] = [int(v) for v in value] if field.is_repeated else int(value)
