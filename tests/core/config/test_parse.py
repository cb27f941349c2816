"""config.pbtxt parsing, defaults, validation and the JSON form."""

from __future__ import annotations

from pathlib import Path

import pytest

from coreserve.config import (
    ModelConfig,
    ModelSignature,
    apply_defaults,
    config_from_dict,
    config_to_dict,
    parse_config,
    read_config_file,
    validate_config,
)
from coreserve.errors import InvalidArgumentError, ModelConfigError
from coreserve.types import DataType, InferenceRequest

BASE = """
name: "m"
max_batch_size: 8
input [ { name: "a" data_type: TYPE_FP32 dims: [ -1, 3 ] } ]
output [ { name: "o" data_type: TYPE_STRING dims: [ 2 ] } ]
"""


def _config(extra: str = "", base: str = BASE):
    config = parse_config(base + extra)
    apply_defaults(config, "m")
    return config


def test_triton_config_parses_with_every_section() -> None:
    text = (
        BASE
        + """
    version_policy: { specific: { versions: [ 1, 3 ] } }
    instance_group [ { count: 2 kind: KIND_CPU }, { kind: KIND_GPU gpus: [ 0, 1 ] } ]
    dynamic_batching {
      preferred_batch_size: [ 4, 8 ]
      max_queue_delay_microseconds: 100
      priority_levels: 2
      default_priority_level: 1
      default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 10 max_queue_size: 4 }
      priority_queue_policy { key: 2 value { max_queue_size: 1 } }
    }
    optimization { graph { level: 1 } execution_accelerators { cpu_execution_accelerator [ { name: "openvino" } ] } }
    parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
    model_warmup [ { name: "w" batch_size: 1 inputs { key: "a" value { data_type: TYPE_FP32 dims: [ 1, 3 ] zero_data: true } } } ]
    model_transaction_policy { decoupled: false }
    response_cache { enable: true }
    """
    )
    config = _config(base=text)
    validate_config(config)
    assert list(config.version_policy.specific.versions) == [1, 3]
    assert config.instance_group[1].gpus == [0, 1]
    assert config.dynamic_batching.priority_queue_policy[2].max_queue_size == 1


def test_syntax_errors_and_unknown_fields_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.pbtxt"
    path.write_text('name: "m"\nmax_batch_size: "eight"\n')
    with pytest.raises(ModelConfigError, match=r'config.pbtxt: 2:17 .*Expected integer, got: "eight"'):
        read_config_file(path)
    with pytest.raises(ModelConfigError, match="colour"):
        parse_config("colour: 1")


# What the real Triton 2.51 logs for each line ("Error parsing text-format inference.ModelConfig:
# 2:17: ..."), and Triton's QA L0_simple_ensemble for max_inflight_requests, which 2.51 lacks.
@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("max_batch_size: abc", "Expected integer, got: abc"),
        ("max_batch_size: 1.5", "Expected integer, got: 1.5"),
        ("max_batch_size: 3000000000", "Integer out of range (3000000000)"),
        ("max_batch_size: 3000000000000000000000", "Integer out of range (3000000000000000000000)"),
        ('dynamic_batching { max_queue_delay_microseconds: "x" }', 'Expected integer, got: "x"'),
        ("dynamic_batching { max_queue_delay_microseconds: -1 }", "Expected integer, got: -"),
        ('input [ { name: "a" dims: [ x ] } ]', "Expected integer, got: x"),
        ("name: 5", "Expected string, got: 5"),
        (
            "instance_group [ { kind: KIND_XPU } ]",
            'Unknown enumeration value of "KIND_XPU" for field "kind".',
        ),
        ("ensemble_scheduling { max_inflight_requests: -5 }", "Expected integer, got: -"),
        (
            'ensemble_scheduling { max_inflight_requests: "invalid_value" }',
            'Expected integer, got: "invalid_value"',
        ),
        ("ensemble_scheduling { max_inflight_requests: 12345678901 }", "Integer out of range (12345678901)"),
    ],
)
def test_a_value_that_does_not_fit_its_field_is_refused_in_the_words_of_tritons_parser(
    line: str, words: str
) -> None:
    with pytest.raises(ModelConfigError) as refused:
        parse_config(f'backend: "python"\n{line}\n', "m/config.pbtxt")
    text = str(refused.value)
    assert text.startswith("m/config.pbtxt: 2:") and text.endswith(f" : '{line}': {words}")


def test_defaults_fill_name_policy_and_instances() -> None:
    config = parse_config("max_batch_size: 0")
    apply_defaults(config, "folder")
    assert config.name == "folder"
    assert config.version_policy.latest.num_versions == 1
    assert [(g.name, g.count) for g in config.instance_group] == [("folder", 1)]
    listed = parse_config("instance_group [ { count: 2 }, { name: 'grp' } ]")
    apply_defaults(listed, "folder")
    assert [(g.name, g.count) for g in listed.instance_group] == [("folder_0", 2), ("grp", 1)]
    with pytest.raises(ModelConfigError, match="folder is named 'other'"):
        apply_defaults(parse_config('name: "x"'), "other")


def test_defaults_fill_what_tritons_normalization_fills() -> None:
    """As Triton's NormalizeModelConfig: the configuration a client reads back is Triton's."""

    def pinned(config: ModelConfig) -> tuple[bool, bool]:
        optimization = config.optimization
        return optimization.input_pinned_memory.enable, optimization.output_pinned_memory.enable

    config = _config("dynamic_batching { }")
    assert list(config.dynamic_batching.preferred_batch_size) == [8]
    assert pinned(config) == (True, True)
    assert pinned(_config("optimization { input_pinned_memory { enable: false } }")) == (False, True)
    sequence = _config("sequence_batching { oldest { } }")
    assert sequence.sequence_batching.max_sequence_idle_microseconds == 1_000_000
    assert list(sequence.sequence_batching.oldest.preferred_batch_size) == [8]
    unbatched = _config("dynamic_batching { }", base="max_batch_size: 0\n")
    assert list(unbatched.dynamic_batching.preferred_batch_size) == []
    ensemble = _config('platform: "ensemble" ensemble_scheduling { }')
    assert not ensemble.HasField("optimization")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("max_batch_size: -1", "max_batch_size' must be >= 0"),
        ('input [ { name: "a" data_type: TYPE_FP32 dims: [ 1 ] } ]', "input name 'a' appears more than once"),
        ('input [ { name: "b" dims: [ 1 ] } ]', "'input[1]' ('b') needs a data_type"),
        ('input [ { name: "b" data_type: TYPE_FP32 dims: [ -2 ] } ]', "every entry of dims must be -1"),
        ('input [ { name: "b" data_type: TYPE_FP32 } ]', "needs dims"),
        ("input [ { data_type: TYPE_FP32 dims: [ 1 ] } ]", "'input[1]' has no name"),
        # Triton's words for reshapes, then the shapes.
        (
            'input [ { name: "b" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 3 ] } } ]',
            "model input 'b' has different size for dims and reshape for m (dims [4], reshape [3])",
        ),
        (
            'input [ { name: "b" data_type: TYPE_FP32 dims: [ 2, -1, 3 ] reshape { shape: [ -1, 6 ] } } ]',
            "model input 'b' has different size for dims and reshape for m",
        ),
        (
            'output [ { name: "o2" data_type: TYPE_FP32 dims: [ -1, 2, -1 ] reshape { shape: [ -1, 2 ] } } ]',
            "model output 'o2' has different number of variable-size dimensions for dims and reshape for m",
        ),
        (
            'input [ { name: "b" data_type: TYPE_FP32 dims: [ 4, -1 ] reshape { shape: [ 4 ] } } ]',
            "model input 'b' has different size for dims and reshape for m",
        ),
        (
            'sequence_batching { control_input [ { name: "S1" control [ { kind: CONTROL_SEQUENCE_START '
            'int32_false_true: [ 0, 1 ] } ] }, { name: "S2" control [ { kind: CONTROL_SEQUENCE_START '
            "int32_false_true: [ 0, 1 ] } ] } ] }",
            "sequence batching specifies multiple CONTROL_SEQUENCE_START tensors for m",
        ),
        ("version_policy: { latest: { num_versions: 0 } }", "num_versions' must be >= 1"),
        ("version_policy: { specific: { } }", "lists no versions"),
        ("version_policy: { specific: { versions: [ 0, -1 ] } }", "must hold versions >= 0, got [0, -1]"),
        ("instance_group [ { kind: 9 } ]", "kind 9 is not a kind of instance group"),
        ("instance_group [ { kind: KIND_CPU gpus: [ 0 ] } ]", "gpus are listed for a KIND_CPU group"),
        ("dynamic_batching { preferred_batch_size: [ 9 ] }", "outside 1..max_batch_size (8)"),
        (
            "dynamic_batching { priority_levels: 2 default_priority_level: 3 }",
            "default_priority_level' must be within",
        ),
        (
            "dynamic_batching { priority_levels: 2 default_priority_level: 1 priority_queue_policy { key: 5 value { } } }",
            "has level 5, outside 1..priority_levels (2)",
        ),
        # Triton's refusals, in its words.
        (
            "dynamic_batching { preserve_ordering: true priority_levels: 2 default_priority_level: 1 }",
            "Only one priority level is allowed when 'preserve_ordering' is true",
        ),
        (
            "dynamic_batching { preserve_ordering: true default_queue_policy { timeout_action: DELAY "
            "default_timeout_microseconds: 100 } }",
            "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true",
        ),
        (
            "dynamic_batching { preserve_ordering: true priority_levels: 1 default_priority_level: 1 "
            "priority_queue_policy { key: 1 value { timeout_action: DELAY default_timeout_microseconds: 5 } } }",
            "Queue policy can not have DELAY as timeout action",
        ),
        (
            'max_batch_size: 0\ninput [ { name: "b" data_type: TYPE_FP32 dims: [ 1 ] reshape { shape: [ ] } } ]',
            "('b'): cannot have empty reshape for non-batching model as scalar tensors are not supported",
        ),
    ],
)
def test_validation_names_the_model_and_field(extra: str, message: str) -> None:
    config = (
        _config(extra)
        if "max_batch_size" not in extra
        else _config(base=BASE.replace("max_batch_size: 8", extra))
    )
    with pytest.raises(ModelConfigError, match="model 'm': ") as info:
        validate_config(config)
    assert message in info.value.message


def test_a_specific_version_policy_may_name_version_0_as_in_triton() -> None:
    validate_config(_config("version_policy: { specific: { versions: [ 0 ] } }"))


def test_dynamic_batching_on_a_model_that_cannot_batch_is_taken_as_triton_takes_it() -> None:
    validate_config(_config("dynamic_batching { }", base=BASE.replace("max_batch_size: 8", "")))


def test_json_form_has_numbers_for_64_bit_fields() -> None:
    config = _config(
        "dynamic_batching { max_queue_delay_microseconds: 100 priority_levels: 2 "
        "default_priority_level: 1 priority_queue_policy { key: 2 value { max_queue_size: 3 "
        "default_timeout_microseconds: 7 } } }"
    )
    data = config_to_dict(config)
    assert data["input"][0]["dims"] == [-1, 3]
    assert data["dynamic_batching"]["max_queue_delay_microseconds"] == 100
    assert data["dynamic_batching"]["priority_queue_policy"]["2"]["default_timeout_microseconds"] == 7
    assert data["max_batch_size"] == 8 and data["output"][0]["data_type"] == "TYPE_STRING"
    assert config_from_dict(data) == config


def test_json_form_takes_a_single_value_of_a_repeated_field_as_tritons_parser_does() -> None:
    config = config_from_dict(
        {
            "instance_group": {"count": 2, "kind": "KIND_CPU"},
            "input": [{"name": "a", "data_type": "TYPE_FP32", "dims": 3}],
            "dynamic_batching": {"preferred_batch_size": 4},
        }
    )
    assert [group.count for group in config.instance_group] == [2] and list(config.input[0].dims) == [3]
    assert list(config.dynamic_batching.preferred_batch_size) == [4]
    with pytest.raises(ModelConfigError, match="max_batch_size"):
        config_from_dict({"max_batch_size": [1]})  # a list where one value goes stays a mistake
    assert config_from_dict({"input": None}) == ModelConfig()  # null: not set
    assert [group.count for group in config_from_dict({"instanceGroup": {"count": 3}}).instance_group] == [3]


def test_json_form_writes_fields_in_their_declared_order_as_triton_does() -> None:
    data = config_to_dict(_config("dynamic_batching { }"))
    assert list(data)[:12] == [
        "name",
        "platform",
        "backend",
        "runtime",
        "version_policy",
        "max_batch_size",
        "input",
        "output",
        "batch_input",
        "batch_output",
        "optimization",
        "dynamic_batching",
    ]
    assert list(data["input"][0])[:4] == ["name", "data_type", "format", "dims"]


def test_signature_checks_requests() -> None:
    signature = ModelSignature(_config())
    assert signature.inputs["a"].datatype is DataType.FP32
    assert signature.outputs["o"].datatype is DataType.BYTES
    assert signature.client_shape(signature.inputs["a"]) == [-1, -1, 3]
    request = InferenceRequest("m", {"a": __import__("numpy").zeros((2, 5, 3), "float32")})
    signature.check_request(request)
    assert request.batch_size == 2
    bad = InferenceRequest("m", {"a": __import__("numpy").zeros((2, 5, 4), "float32")})
    with pytest.raises(InvalidArgumentError, match=r"Expected \[-1,-1,3\], got \[2,5,4\]"):
        signature.check_request(bad)


def test_signature_applies_reshape_both_ways() -> None:
    import numpy as np

    config = _config(
        base="""
    name: "m" max_batch_size: 4
    input [ { name: "a" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 2, 2 ] } } ]
    output [ { name: "o" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 2, 2 ] } } ]
    """
    )
    signature = ModelSignature(config)
    request = InferenceRequest("m", {"a": np.zeros((3, 4), np.float32)})
    signature.check_request(request)
    assert request.inputs["a"].shape == (3, 2, 2)
    restored = signature.restore_output_shapes({"o": np.zeros((3, 2, 2), np.float32)})
    assert restored["o"].shape == (3, 4)


def test_only_fields_that_coreserve_does_not_act_on_are_reported_as_ignored() -> None:
    from coreserve.config.ignored import ignored_fields

    warmup = 'model_warmup [ { name: "w" batch_size: 1 inputs { key: "a" value { data_type: TYPE_FP32 dims: [ 3 ] zero_data: true } } } ]\n'
    assert ignored_fields(_config(warmup + "dynamic_batching { }")) == []
    # rate_limiter acts under --rate-limit=execution_count (the loader warns when it is off).
    unused = (
        "response_cache { enable: true }\ninstance_group [ { rate_limiter { priority: 1 } } ]\n"
        'model_repository_agents { agents [ { name: "checksum" } ] }\n'
    )
    assert ignored_fields(_config(unused)) == ["model_repository_agents"]
