"""Triton's execution accelerators as ONNX Runtime providers: the mapping as a pure function, and
what an instance does when the installed onnxruntime lacks a provider."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import onnxruntime as ort
import pytest

from coreserve import ModelConfig, ModelConfigError, UnavailableError
from coreserve.backend import InstanceKind, InstancePlacement, ModelFiles, ServerContext
from coreserve.config import apply_defaults, parse_config
from coreserve_onnx import OnnxBackend
from coreserve_onnx._accelerators import (
    CPU,
    CUDA,
    OPENVINO,
    TENSORRT,
    Provider,
    available_providers,
    plan_providers,
)
from support.model_builders import add_sub_model, write_model

GPU, CPU_KIND = InstanceKind.GPU, InstanceKind.CPU
NO_OPENVINO = OPENVINO not in ort.get_available_providers()


def _config(accelerators: str, parameters: str = "") -> ModelConfig:
    return parse_config(
        f'name: "m" optimization {{ execution_accelerators {{ {accelerators} }} }} {parameters}'
    )


def _plan(
    accelerators: str, kind: InstanceKind = GPU, device_id: int = 1, parameters: str = ""
) -> list[tuple[str, dict[str, str], bool]]:
    return [
        (p.name, dict(p.options), p.optional)
        for p in plan_providers(_config(accelerators, parameters), kind, device_id)
    ]


def test_tensorrt_parameters_map_to_the_provider_options_as_triton_maps_them() -> None:
    plan = _plan(
        'gpu_execution_accelerator [ { name: "tensorrt" '
        'parameters { key: "precision_mode" value: "FP16" } '
        'parameters { key: "max_workspace_size_bytes" value: "1073741824" } '
        'parameters { key: "trt_engine_cache_enable" value: "true" } '
        'parameters { key: "trt_engine_cache_path" value: "/tmp/trt" } '
        'parameters { key: "int8_use_native_calibration_table" value: "0" } '
        'parameters { key: "trt_builder_optimization_level" value: "3" } '
        'parameters { key: "trt_timing_cache_path" value: "" } } ]'
    )
    assert plan == [
        (
            TENSORRT,
            {
                "trt_int8_use_native_calibration_table": "0",
                "trt_max_workspace_size": "1073741824",
                "trt_fp16_enable": "1",
                "trt_builder_optimization_level": "3",
                "trt_engine_cache_enable": "1",
                "trt_engine_cache_path": "/tmp/trt",
                "device_id": "1",
            },
            False,
        ),
        (CUDA, {"device_id": "1"}, False),
        (CPU, {}, False),
    ]


@pytest.mark.parametrize(
    ("mode", "flag"),
    [("FP32", None), ("FP16", "trt_fp16_enable"), ("BF16", "trt_bf16_enable"), ("INT8", "trt_int8_enable")],
)
def test_precision_modes(mode: str, flag: str | None) -> None:
    plan = _plan(
        f'gpu_execution_accelerator [ {{ name: "tensorrt" parameters {{ key: "precision_mode" value: "{mode}" }} }} ]'
    )
    options = plan[0][1]
    assert options == ({flag: "1", "device_id": "1"} if flag else {"device_id": "1"})


def test_cuda_accelerator_and_the_deprecated_model_parameters_set_cuda_options() -> None:
    plan = _plan(
        'gpu_execution_accelerator [ { name: "cuda" '
        'parameters { key: "cudnn_conv_use_max_workspace" value: "0" } '
        'parameters { key: "use_ep_level_unified_stream" value: "TRUE" } } ]',
        device_id=0,
        parameters='parameters { key: "cudnn_conv_algo_search" value: { string_value: "1" } } '
        'parameters { key: "gpu_mem_limit" value: { string_value: "4294967200" } } '
        'parameters { key: "arena_extend_strategy" value: { string_value: "1" } } '
        'parameters { key: "do_copy_in_default_stream" value: { string_value: "false" } }',
    )
    assert plan == [
        (
            CUDA,
            {
                "cudnn_conv_algo_search": "HEURISTIC",
                "arena_extend_strategy": "kSameAsRequested",
                "gpu_mem_limit": "4294967200",
                "do_copy_in_default_stream": "0",
                "cudnn_conv_use_max_workspace": "0",
                "use_ep_level_unified_stream": "1",
                "device_id": "0",
            },
            False,
        ),
        (CPU, {}, False),
    ]


def test_openvino_runs_on_every_instance_and_gpu_accelerators_only_on_gpu_ones() -> None:
    accelerators = 'gpu_execution_accelerator [ { name: "tensorrt" } ] cpu_execution_accelerator [ { name: "openvino" } ]'
    assert [name for name, _, _ in _plan(accelerators)] == [TENSORRT, CUDA, OPENVINO, CPU]
    assert _plan(accelerators, CPU_KIND) == [(OPENVINO, {"device_type": "CPU"}, False), (CPU, {}, False)]
    assert _plan("", CPU_KIND) == [(CPU, {}, False)]
    assert _plan("", GPU, 2) == [(CUDA, {"device_id": "2"}, False), (CPU, {}, False)]


def test_optional_accelerators_are_marked() -> None:
    optional = (
        'parameters { key: "optional_execution_accelerators" value: { string_value: "openvino, tensorrt" } }'
    )
    plan = _plan(
        'gpu_execution_accelerator [ { name: "tensorrt" } ] cpu_execution_accelerator [ { name: "openvino" } ]',
        parameters=optional,
    )
    assert [(name, is_optional) for name, _, is_optional in plan] == [
        (TENSORRT, True),
        (CUDA, False),
        (OPENVINO, True),
        (CPU, False),
    ]


@pytest.mark.parametrize(
    ("accelerators", "parameters", "message"),
    [
        (
            'gpu_execution_accelerator [ { name: "tensort" } ]',
            "",
            "unknown Execution Accelerator 'tensort' is requested in gpu_execution_accelerator",
        ),
        (
            'cpu_execution_accelerator [ { name: "tensorrt" } ]',
            "",
            "unknown Execution Accelerator 'tensorrt' is requested in cpu_execution_accelerator",
        ),
        (
            'gpu_execution_accelerator [ { name: "tensorrt" parameters { key: "precision_mode" value: "FP64" } } ]',
            "",
            "unsupported precision mode 'FP64' is requested",
        ),
        (
            'gpu_execution_accelerator [ { name: "tensorrt" parameters { key: "workspace" value: "1" } } ]',
            "",
            "unknown parameter 'workspace' is provided for TensorRT Execution Accelerator",
        ),
        (
            'gpu_execution_accelerator [ { name: "tensorrt" '
            'parameters { key: "max_workspace_size_bytes" value: "1GB" } } ]',
            "",
            "parameter 'max_workspace_size_bytes' must be an integer >= 0, got '1GB'",
        ),
        (
            'gpu_execution_accelerator [ { name: "tensorrt" '
            'parameters { key: "trt_engine_cache_enable" value: "maybe" } } ]',
            "",
            "parameter 'trt_engine_cache_enable' must be true or false (1 or 0), got 'maybe'",
        ),
        (
            'gpu_execution_accelerator [ { name: "tensorrt" parameters { key: "trt_dla_core" value: "x" } } ]',
            "",
            "parameter 'trt_dla_core' must be an integer, got 'x'",
        ),
        (
            'gpu_execution_accelerator [ { name: "cuda" '
            'parameters { key: "do_copy_in_default_stream" value: "2" } } ]',
            "",
            "execution accelerator 'cuda': parameter 'do_copy_in_default_stream' must be true or false",
        ),
        (
            'gpu_execution_accelerator [ { name: "tensorrt" }, { name: "tensorrt" } ]',
            "",
            "execution accelerator 'tensorrt' is listed twice",
        ),
        (
            'cpu_execution_accelerator [ { name: "openvino" parameters { key: "device_type" value: "GPU" } } ]',
            "",
            "execution accelerator 'openvino' takes no parameters",
        ),
        (
            "",
            'parameters { key: "cudnn_conv_algo_search" value: { string_value: "7" } }',
            "unsupported cudnn_conv_algo_search value '7' is requested",
        ),
        (
            "",
            'parameters { key: "gpu_mem_limit" value: { string_value: "-1" } }',
            "parameter 'gpu_mem_limit' must be an integer >= 0, got '-1'",
        ),
        (
            "",
            'parameters { key: "optional_execution_accelerators" value: { string_value: "cuda" } }',
            "parameter 'optional_execution_accelerators' names cuda; it takes a comma-separated list "
            "of openvino and tensorrt",
        ),
    ],
)
@pytest.mark.parametrize("kind", [GPU, CPU_KIND])
def test_bad_accelerators_are_load_errors_on_any_instance(
    accelerators: str, parameters: str, message: str, kind: InstanceKind
) -> None:
    with pytest.raises(ModelConfigError) as info:
        plan_providers(_config(accelerators, parameters), kind, 0)
    assert info.value.message.startswith("model 'm': ")
    assert message in info.value.message


def test_a_missing_provider_is_named_unless_optional() -> None:
    planned = [Provider(OPENVINO, {"device_type": "CPU"}, "openvino"), Provider(CPU, {}, "cpu")]
    with pytest.raises(UnavailableError) as info:
        available_providers(planned, [CPU], "m", "m_0_0")
    assert info.value.message == (
        "model 'm': execution accelerator 'openvino' needs OpenVINOExecutionProvider, which this "
        "onnxruntime build lacks (it has CPUExecutionProvider); install a build with it, or name "
        "'openvino' in parameter 'optional_execution_accelerators' to load the model without it"
    )
    optional = [Provider(OPENVINO, {}, "openvino", optional=True), Provider(CPU, {}, "cpu")]
    assert available_providers(optional, [CPU], "m", "m_0_0") == ([optional[1]], [optional[0]])
    assert available_providers(optional, [OPENVINO, CPU], "m", "m_0_0") == (optional, [])
    gpu = [Provider(TENSORRT, {}, "tensorrt", optional=True), Provider(CUDA, {}, "cuda"), Provider(CPU)]
    with pytest.raises(UnavailableError, match=r"is KIND_GPU, but this onnxruntime has no CUDA provider"):
        available_providers(gpu, [CPU], "m", "m_0_0")
    assert available_providers(gpu, [CUDA, CPU], "m", "m_0_0") == (gpu[1:], gpu[:1])


def _create(
    tmp_path: Path, config_text: str, kind: InstanceKind, logger: logging.Logger | None = None
) -> object:
    write_model(tmp_path, "m", add_sub_model("FP32", ["batch", 3]))
    config = parse_config(
        "max_batch_size: 8\n"
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 3 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 3 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
        + config_text
    )
    apply_defaults(config, "m")
    files = ModelFiles(name="m", path=tmp_path / "m", version=1, filename="model.onnx")
    placement = InstancePlacement(name="m_0_0", group_name="m_0", index=0, kind=kind, device_id=0)
    context = ServerContext(logger=logger) if logger else ServerContext()
    return asyncio.run(OnnxBackend().create_instance(files, config, placement, context))


OPENVINO_ACCELERATOR = (
    'optimization { execution_accelerators { cpu_execution_accelerator [ { name: "openvino" } ] } }\n'
)


@pytest.mark.skipif(not NO_OPENVINO, reason="this onnxruntime has the OpenVINO provider")
def test_an_instance_without_its_accelerator_is_unavailable_unless_optional(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(UnavailableError, match="'openvino' needs OpenVINOExecutionProvider"):
        _create(tmp_path, OPENVINO_ACCELERATOR, CPU_KIND)
    optional = 'parameters { key: "optional_execution_accelerators" value: { string_value: "openvino" } }'
    logger = logging.getLogger("test_accelerators")
    with caplog.at_level(logging.INFO, logger="test_accelerators"):
        instance = _create(tmp_path, OPENVINO_ACCELERATOR + optional, CPU_KIND, logger)
    asyncio.run(instance.close())  # type: ignore[attr-defined]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "model 'm': execution accelerator 'openvino' needs OpenVINOExecutionProvider, which this onnxruntime "
        f"build lacks (it has {', '.join(ort.get_available_providers())}); instance 'm_0_0' runs without it "
        "(it is listed in 'optional_execution_accelerators')"
    ]
    assert "model 'm': instance 'm_0_0' runs on CPUExecutionProvider" in caplog.messages


@pytest.mark.skipif(CUDA in ort.get_available_providers(), reason="this onnxruntime has the CUDA provider")
def test_a_gpu_instance_names_the_missing_tensorrt_provider_before_cuda(tmp_path: Path) -> None:
    tensorrt = (
        'optimization { execution_accelerators { gpu_execution_accelerator [ { name: "tensorrt" } ] } }\n'
    )
    with pytest.raises(UnavailableError, match="'tensorrt' needs TensorrtExecutionProvider, which this"):
        _create(tmp_path, tensorrt, GPU)
    optional = 'parameters { key: "optional_execution_accelerators" value: { string_value: "tensorrt" } }'
    with pytest.raises(UnavailableError, match=r"no CUDA provider: install the GPU build"):
        _create(tmp_path, tensorrt + optional, GPU)
    # On a CPU instance the GPU accelerators do not apply: it loads on the CPU build.
    asyncio.run(_create(tmp_path, tensorrt, CPU_KIND).close())  # type: ignore[attr-defined]
