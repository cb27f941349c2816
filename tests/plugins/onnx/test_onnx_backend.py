"""The onnxruntime backend on real ONNX models: auto-complete, checks, session settings, execution."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from coreserve import DataType, InferenceRequest, ModelConfigError, UnavailableError, UnsupportedError
from coreserve.backend import (
    InstanceKind,
    InstancePlacement,
    ModelFiles,
    ModelSignature,
    Responder,
    ServerContext,
)
from coreserve.config import apply_defaults, parse_config, validate_config
from coreserve.responses import SingleResponse
from coreserve_onnx import OnnxBackend
from coreserve_onnx._session import session_options
from support.model_builders import add_sub_model, identity_model, onnx_model, write_model

CPU = InstancePlacement(name="m_0_0", group_name="m_0", index=0, kind=InstanceKind.CPU)


def _files(repository: Path, name: str = "m") -> ModelFiles:
    return ModelFiles(name=name, path=repository / name, version=1, filename="model.onnx")


def _complete(repository: Path, config_text: str = "", **backend_config: str):
    config = parse_config(config_text)
    context = ServerContext(backend_config=backend_config)
    completed = OnnxBackend().auto_complete_config(_files(repository), config, context)
    apply_defaults(completed, "m")
    validate_config(completed)
    return completed


def test_auto_complete_batching_model(tmp_path: Path) -> None:
    write_model(tmp_path, "m", add_sub_model("INT64", ["batch", 3]))
    config = _complete(tmp_path)
    assert config.max_batch_size == 4
    assert config.HasField("dynamic_batching")
    assert [(t.name, t.data_type, list(t.dims)) for t in config.input] == [
        ("INPUT0", DataType.INT64.config_value, [3]),
        ("INPUT1", DataType.INT64.config_value, [3]),
    ]
    assert [t.name for t in config.output] == ["OUTPUT0", "OUTPUT1"]


def test_auto_complete_respects_backend_config_and_fixed_shapes(tmp_path: Path) -> None:
    write_model(tmp_path, "m", add_sub_model("FP32", ["batch", 3]))
    assert _complete(tmp_path, **{"default-max-batch-size": "16"}).max_batch_size == 16
    assert _complete(tmp_path, **{"default-max-batch-size": "0"}).max_batch_size == 0
    write_model(tmp_path, "m", identity_model("FP32", [2, "n"]))
    config = _complete(tmp_path)
    assert config.max_batch_size == 0 and list(config.input[0].dims) == [2, -1]
    assert not config.HasField("dynamic_batching")


def test_auto_complete_keeps_what_the_config_says(tmp_path: Path) -> None:
    write_model(tmp_path, "m", add_sub_model("FP32", ["batch", 3]))
    config = _complete(tmp_path, "max_batch_size: 2")
    assert config.max_batch_size == 2 and list(config.input[0].dims) == [3]
    config = _complete(
        tmp_path,
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1, 3 ] }, '
        '{ name: "INPUT1" data_type: TYPE_FP32 dims: [ -1, 3 ] } ]',
    )
    assert config.max_batch_size == 0 and len(config.output) == 2


def _instance(tmp_path: Path, model, config_text: str):
    write_model(tmp_path, "m", model)
    config = parse_config(config_text)
    apply_defaults(config, "m")
    validate_config(config)
    return asyncio.run(OnnxBackend().create_instance(_files(tmp_path), config, CPU, ServerContext())), config


ADD_SUB = """
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 3 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 3 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 3 ] } ]
"""


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            ADD_SUB.replace('dims: [ 3 ] }, { name: "INPUT1"', 'dims: [ 4 ] }, { name: "INPUT1"'),
            "configuration's shape [-1, 4] does not fit the ONNX model's shape [-1, 3]",
        ),
        (
            ADD_SUB.replace('"OUTPUT1"', '"OUT9"'),
            "configuration output 'OUT9' is not an output of the ONNX model",
        ),
        (
            ADD_SUB.replace(', { name: "INPUT1" data_type: TYPE_FP32 dims: [ 3 ] }', ""),
            "the ONNX model needs input(s) ['INPUT1']",
        ),
        (
            ADD_SUB.replace("max_batch_size: 8", "max_batch_size: 0"),
            "configuration's shape [3] does not fit the ONNX model's shape [-1, 3]",
        ),
    ],
)
def test_config_must_fit_the_model(tmp_path: Path, config: str, message: str) -> None:
    with pytest.raises(ModelConfigError) as info:
        _instance(tmp_path, add_sub_model("FP32", ["batch", 3]), config)
    assert message in info.value.message


def test_batching_needs_a_dynamic_first_dimension(tmp_path: Path) -> None:
    with pytest.raises(ModelConfigError, match="first dimension must be dynamic"):
        _instance(tmp_path, add_sub_model("FP32", [1, 3]), ADD_SUB)


def test_bf16_models_are_refused_clearly(tmp_path: Path) -> None:
    model = onnx_model(
        [helper.make_node("Identity", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [2])],
        [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [2])],
    )
    config = 'input [ { name: "x" data_type: TYPE_BF16 dims: [ 2 ] } ] output [ { name: "y" data_type: TYPE_BF16 dims: [ 2 ] } ]'
    with pytest.raises(UnsupportedError, match="cannot exchange BF16"):
        _instance(tmp_path, model, config)


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        (
            'parameters { key: "intra_op_thread_count" value: { string_value: "two" } }',
            "must be an integer, got 'two'",
        ),
        ('parameters { key: "inter_op_thread_count" value: { string_value: "-1" } }', "must be >= 0"),
        (
            'parameters { key: "execution_mode" value: { string_value: "3" } }',
            "0 (sequential) or 1 (parallel)",
        ),
        ('parameters { key: "enable_mem_arena" value: { string_value: "maybe" } }', "must be true or false"),
        ('parameters { key: "allow_spinning" value: { string_value: "often" } }', "must be true or false"),
        ("optimization { graph { level: 5 } }", "'optimization.graph.level' must be one of [-1, 0, 1, 2]"),
    ],
)
def test_bad_session_parameters(parameters: str, message: str) -> None:
    config = parse_config('name: "m" ' + parameters)
    with pytest.raises(ModelConfigError) as info:
        session_options(config)
    assert message in info.value.message


def test_session_parameters_are_applied() -> None:
    config = parse_config(
        'name: "m" optimization { graph { level: -1 } } '
        'parameters { key: "intra_op_thread_count" value: { string_value: "1" } } '
        'parameters { key: "execution_mode" value: { string_value: "1" } }'
    )
    options = session_options(config)
    assert options.intra_op_num_threads == 1
    assert options.execution_mode == ort.ExecutionMode.ORT_PARALLEL
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC


def test_copies_share_the_cores_unless_the_configuration_sets_the_threads() -> None:
    cores = len(os.sched_getaffinity(0))
    plain = parse_config('name: "m"')
    assert session_options(plain).intra_op_num_threads == 0  # ONNX Runtime's default: every core
    assert session_options(plain, copies=2).intra_op_num_threads == max(1, cores // 2)
    assert session_options(plain, copies=4 * cores).intra_op_num_threads == 1
    set_here = parse_config(
        'name: "m" parameters { key: "intra_op_thread_count" value: { string_value: "3" } }'
    )
    assert session_options(set_here, copies=2).intra_op_num_threads == 3


def test_intra_op_threads_spin_only_when_asked() -> None:
    spinning = "session.intra_op.allow_spinning"
    assert session_options(parse_config('name: "m"')).get_session_config_entry(spinning) == "0"
    config = parse_config('name: "m" parameters { key: "allow_spinning" value: { string_value: "true" } }')
    assert session_options(config).get_session_config_entry(spinning) == "1"


def test_gpu_instances_need_the_cuda_provider(tmp_path: Path) -> None:
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this machine has onnxruntime-gpu; the refusal applies to the CPU build only")
    write_model(tmp_path, "m", add_sub_model("FP32", ["batch", 3]))
    config = parse_config(ADD_SUB)
    apply_defaults(config, "m")
    gpu = InstancePlacement(name="m_0_0", group_name="m_0", index=0, kind=InstanceKind.GPU, device_id=0)
    with pytest.raises(UnavailableError, match=r"plugin-onnx\[gpu\]"):
        asyncio.run(OnnxBackend().create_instance(_files(tmp_path), config, gpu, ServerContext()))


def test_execute_merges_a_batch_and_splits_it_back(tmp_path: Path) -> None:
    instance, config = _instance(tmp_path, add_sub_model("FP32", ["batch", 3]), ADD_SUB)
    signature = ModelSignature(config)

    async def run() -> list:
        loop = asyncio.get_running_loop()
        requests = []
        for rows in (1, 2, 3):
            a = np.full((rows, 3), rows, np.float32)
            request = InferenceRequest(
                "m", {"INPUT0": a, "INPUT1": a.copy()}, requested_outputs=("OUTPUT0",) if rows == 2 else None
            )
            signature.check_request(request)
            request.sink = SingleResponse(loop)
            requests.append(request)
        await instance.execute(requests, Responder(signature, "1", requests))
        results = [await r.sink.future for r in requests]
        await instance.close()
        return results

    first, second, third = asyncio.run(run())
    np.testing.assert_array_equal(first.outputs["OUTPUT0"], np.full((1, 3), 2, np.float32))
    assert list(second.outputs) == ["OUTPUT0"] and second.outputs["OUTPUT0"].shape == (2, 3)
    np.testing.assert_array_equal(third.outputs["OUTPUT1"], np.zeros((3, 3), np.float32))
