"""Our .proto schemas against the wire: tritonclient's generated modules are the reference."""

from __future__ import annotations

import importlib.util
import sys

from google.protobuf.descriptor import Descriptor, EnumDescriptor, FileDescriptor

from coreserve.protos import grpc_service_pb2, model_config_pb2
from support.paths import REPO


def _enum_shape(enum: EnumDescriptor) -> dict[str, int]:
    return {value.name: value.number for value in enum.values}


def _message_shape(message: Descriptor) -> dict[str, object]:
    return {
        "fields": {
            field.name: (
                field.number,
                field.type,
                field.is_repeated,
                field.message_type.full_name if field.message_type else None,
                field.enum_type.full_name if field.enum_type else None,
                field.containing_oneof.name if field.containing_oneof else None,
            )
            for field in message.fields
        },
        "map_entry": message.GetOptions().map_entry,
        "enums": {enum.name: _enum_shape(enum) for enum in message.enum_types},
        "nested": {nested.name: _message_shape(nested) for nested in message.nested_types},
    }


def _file_shape(file: FileDescriptor) -> dict[str, object]:
    return {
        "package": file.package,
        "enums": {name: _enum_shape(enum) for name, enum in file.enum_types_by_name.items()},
        "messages": {name: _message_shape(msg) for name, msg in file.message_types_by_name.items()},
        "services": {
            name: {
                method.name: (
                    method.input_type.full_name,
                    method.output_type.full_name,
                    method.client_streaming,
                    method.server_streaming,
                )
                for method in service.methods
            }
            for name, service in file.services_by_name.items()
        },
    }


def test_model_config_matches_tritonclient() -> None:
    from tritonclient.grpc import model_config_pb2 as reference

    assert _file_shape(model_config_pb2.DESCRIPTOR) == _file_shape(reference.DESCRIPTOR)


def test_grpc_service_matches_tritonclient() -> None:
    from tritonclient.grpc import service_pb2 as reference

    assert _file_shape(grpc_service_pb2.DESCRIPTOR) == _file_shape(reference.DESCRIPTOR)


def test_messages_cross_the_wire_both_ways() -> None:
    from tritonclient.grpc import service_pb2 as reference

    ours = grpc_service_pb2.ModelInferRequest(model_name="m", id="7", raw_input_contents=[b"\x01"])
    ours.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
    ours.parameters["sequence_id"].uint64_param = 42
    theirs = reference.ModelInferRequest.FromString(ours.SerializeToString())
    assert theirs.inputs[0].shape == [1, 4]
    assert theirs.parameters["sequence_id"].uint64_param == 42
    assert grpc_service_pb2.ModelInferRequest.FromString(theirs.SerializeToString()) == ours


def test_generated_modules_are_fresh() -> None:
    """Fails when protos/*.proto changed without running `python protos/generate.py`."""
    spec = importlib.util.spec_from_file_location("_generate_protos", REPO / "protos" / "generate.py")
    assert spec and spec.loader
    generate = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = generate
    spec.loader.exec_module(generate)
    rendered = generate.render()
    committed_dir = REPO / "core" / "coreserve" / "protos"
    stale = [name for name, text in rendered.items() if (committed_dir / name).read_text() != text]
    assert not stale, f"stale generated modules {stale}: run `python protos/generate.py`"
