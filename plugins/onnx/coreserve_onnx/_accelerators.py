"""Triton's `optimization { execution_accelerators }` as the ONNX Runtime execution providers of
one session, with Triton's parameter names.

Pure functions (onnxruntime is not imported): what a configuration asks for can be checked on
any machine, whatever onnxruntime build it has. As in Triton's ONNX Runtime backend:

- `gpu_execution_accelerator` applies to GPU instances: `tensorrt` (TensorrtExecutionProvider,
  before CUDA) and `cuda` (options of the CUDAExecutionProvider every GPU instance has);
- `cpu_execution_accelerator` applies to every instance: `openvino` (OpenVINOExecutionProvider,
  device_type CPU);
- ONNX Runtime's CPU provider comes last and runs what the others do not take.

Unlike Triton, a CPU instance checks the GPU accelerators too (a typo shows on a CPU machine,
not first on the GPU one). An accelerator that the installed build lacks makes the instance
UNAVAILABLE, unless the model's parameter `optional_execution_accelerators` names it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from coreserve import ModelConfig, ModelConfigError, UnavailableError
from coreserve.backend import InstanceKind, str_parameter

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"
OPENVINO = "OpenVINOExecutionProvider"
OPTIONAL_PARAMETER = "optional_execution_accelerators"
# Only these may be missing: a GPU instance without CUDA cannot run on its GPU at all.
MAY_BE_OPTIONAL = ("openvino", "tensorrt")
CUDA_INSTALL_HINT = "install the GPU build (pip uninstall onnxruntime && pip install 'plugin-onnx[gpu]')"

_TRUE = ("1", "true", "on", "yes")
_FALSE = ("0", "false", "off", "no")


@dataclass(frozen=True)
class Provider:
    """One execution provider of a session: ONNX Runtime's name and options, the accelerator
    of the configuration it comes from, and whether the model may load without it."""

    name: str
    options: Mapping[str, str] = field(default_factory=dict)
    accelerator: str = ""
    optional: bool = False

    def as_ort(self) -> tuple[str, dict[str, str]]:
        """The (name, options) pair `onnxruntime.InferenceSession(providers=...)` takes."""
        return self.name, dict(self.options)


def _unsigned(value: str) -> str:
    if not value.isdigit():
        raise ValueError("an integer >= 0")
    return value


def _integer(value: str) -> str:
    try:
        int(value)
    except ValueError:
        raise ValueError("an integer") from None
    return value


def _boolean(value: str) -> str:
    # ONNX Runtime reads provider flags as 0/1; Triton also takes true/false (any case), on/off.
    if value.lower() in _TRUE:
        return "1"
    if value.lower() in _FALSE:
        return "0"
    raise ValueError("true or false (1 or 0)")


def _text(value: str) -> str:
    return value


_TENSORRT_INTEGERS = (
    "trt_max_partition_iterations",
    "trt_min_subgraph_size",
    "trt_dla_core",
    "trt_builder_optimization_level",
    "trt_auxiliary_streams",
    "trt_ep_context_embed_mode",
)
_TENSORRT_FLAGS = (
    "trt_dla_enable",
    "trt_engine_cache_enable",
    "trt_dump_subgraphs",
    "trt_force_sequential_engine_build",
    "trt_context_memory_sharing_enable",
    "trt_layer_norm_fp32_fallback",
    "trt_timing_cache_enable",
    "trt_force_timing_cache",
    "trt_detailed_build_log",
    "trt_build_heuristics_enable",
    "trt_sparsity_enable",
    "trt_cuda_graph_enable",
    "trt_dump_ep_context_model",
)
_TENSORRT_TEXTS = (
    "trt_engine_cache_path",
    "trt_engine_cache_prefix",
    "trt_timing_cache_path",
    "trt_tactic_sources",
    "trt_extra_plugin_lib_paths",
    "trt_profile_min_shapes",
    "trt_profile_max_shapes",
    "trt_profile_opt_shapes",
    "trt_ep_context_file_path",
)
# Triton's name -> (TensorRT provider option, how the value is checked); precision_mode apart.
_TENSORRT_OPTIONS: dict[str, tuple[str, Callable[[str], str]]] = {
    "max_workspace_size_bytes": ("trt_max_workspace_size", _unsigned),
    "int8_calibration_table_name": ("trt_int8_calibration_table_name", _text),
    "int8_use_native_calibration_table": ("trt_int8_use_native_calibration_table", _boolean),
    **{name: (name, _integer) for name in _TENSORRT_INTEGERS},
    **{name: (name, _boolean) for name in _TENSORRT_FLAGS},
    **{name: (name, _text) for name in _TENSORRT_TEXTS},
}
TENSORRT_PARAMETERS = ("precision_mode", *sorted(_TENSORRT_OPTIONS))
_PRECISIONS = {"FP32": None, "FP16": "trt_fp16_enable", "BF16": "trt_bf16_enable", "INT8": "trt_int8_enable"}
# CUDA options Triton checks as flags; it hands any other key to ONNX Runtime as it is.
_CUDA_FLAGS = ("do_copy_in_default_stream", "use_ep_level_unified_stream")
# The model-level parameters Triton still reads for the CUDA provider (deprecated there).
_CUDA_MODEL_CHOICES = {
    "cudnn_conv_algo_search": {"0": "EXHAUSTIVE", "1": "HEURISTIC", "2": "DEFAULT"},
    "arena_extend_strategy": {"0": "kNextPowerOfTwo", "1": "kSameAsRequested"},
}
_CUDA_MODEL_VALUES: dict[str, Callable[[str], str]] = {
    "gpu_mem_limit": _unsigned,
    "do_copy_in_default_stream": _boolean,
}


def _where(config: ModelConfig, accelerator: str) -> str:
    return f"model '{config.name}': execution accelerator '{accelerator}'"


def _checked(config: ModelConfig, accelerator: str, key: str, value: str, check: Callable[[str], str]) -> str:
    try:
        return check(value.strip())
    except ValueError as exc:
        raise ModelConfigError(
            f"{_where(config, accelerator)}: parameter '{key}' must be {exc}, got '{value}'"
        ) from None


def tensorrt_options(config: ModelConfig, parameters: Mapping[str, str], device_id: int) -> dict[str, str]:
    """The TensorrtExecutionProvider options for Triton's `tensorrt` accelerator parameters.

    :param config: the model's configuration (named in errors).
    :param parameters: the accelerator's `parameters`.
    :param device_id: the instance's GPU.
    :raises ModelConfigError: an unknown parameter or a value of the wrong kind.
    """
    options: dict[str, str] = {}
    for key in sorted(parameters):
        value = parameters[key]
        if key == "precision_mode":
            if value not in _PRECISIONS:
                raise ModelConfigError(
                    f"{_where(config, 'tensorrt')}: unsupported precision mode '{value}' is requested "
                    f"(one of {', '.join(_PRECISIONS)})"
                )
            flag = _PRECISIONS[value]
            if flag is not None:
                options[flag] = "1"
            continue
        if key not in _TENSORRT_OPTIONS:
            raise ModelConfigError(
                f"{_where(config, 'tensorrt')}: unknown parameter '{key}' is provided for TensorRT "
                f"Execution Accelerator (known: {', '.join(TENSORRT_PARAMETERS)})"
            )
        name, check = _TENSORRT_OPTIONS[key]
        checked = _checked(config, "tensorrt", key, value, check)
        if checked:  # Triton leaves out an empty value, so ONNX Runtime's default holds
            options[name] = checked
    options["device_id"] = str(device_id)
    return options


def cuda_options(config: ModelConfig, parameters: Mapping[str, str], device_id: int) -> dict[str, str]:
    """The CUDAExecutionProvider options: the deprecated model parameters Triton still reads,
    then the `cuda` accelerator's parameters (passed on as ONNX Runtime names them), then the
    instance's GPU.

    :param config: the model's configuration (its `parameters` and name).
    :param parameters: the `cuda` accelerator's parameters (empty when there is none).
    :param device_id: the instance's GPU.
    """
    options: dict[str, str] = {}
    for key, choices in _CUDA_MODEL_CHOICES.items():
        value = str_parameter(config, key)
        if value is None:
            continue
        if value not in choices:
            raise ModelConfigError(
                f"model '{config.name}': unsupported {key} value '{value}' is requested "
                f"(one of {', '.join(choices)})"
            )
        options[key] = choices[value]
    for key, check in _CUDA_MODEL_VALUES.items():
        value = str_parameter(config, key)
        if value is None:
            continue
        try:
            options[key] = check(value)
        except ValueError as exc:
            raise ModelConfigError(
                f"model '{config.name}': parameter '{key}' must be {exc}, got '{value}'"
            ) from None
    for key in sorted(parameters):
        check = _boolean if key in _CUDA_FLAGS else _text
        value = _checked(config, "cuda", key, parameters[key], check)
        if value:
            options[key] = value
    options["device_id"] = str(device_id)
    return options


def optional_accelerators(config: ModelConfig) -> frozenset[str]:
    """The accelerators the model may load without: parameter `optional_execution_accelerators`,
    comma-separated names (coreserve's; Triton has no such setting)."""
    value = str_parameter(config, OPTIONAL_PARAMETER)
    if not value:
        return frozenset()
    names = frozenset(name.strip() for name in value.split(",") if name.strip())
    unknown = sorted(names.difference(MAY_BE_OPTIONAL))
    if unknown:
        raise ModelConfigError(
            f"model '{config.name}': parameter '{OPTIONAL_PARAMETER}' names {', '.join(unknown)}; "
            f"it takes a comma-separated list of {' and '.join(MAY_BE_OPTIONAL)}"
        )
    return names


def _listed(config: ModelConfig, accelerators: Iterable[Any], known: Sequence[str], side: str) -> list[Any]:
    """The accelerators of one side, each known and listed once."""
    seen: set[str] = set()
    listed = []
    for accelerator in accelerators:
        name = accelerator.name
        if name not in known:
            raise ModelConfigError(
                f"model '{config.name}': unknown Execution Accelerator '{name}' is requested in "
                f"{side}_execution_accelerator (the ONNX Runtime backend knows {', '.join(known)})"
            )
        if name in seen:
            raise ModelConfigError(f"{_where(config, name)} is listed twice in {side}_execution_accelerator")
        seen.add(name)
        listed.append(accelerator)
    return listed


def plan_providers(config: ModelConfig, kind: InstanceKind, device_id: int = 0) -> list[Provider]:
    """The execution providers of one instance's session, in the order ONNX Runtime tries them.

    :param config: the model's configuration.
    :param kind: the instance's kind (GPU accelerators apply to GPU instances only).
    :param device_id: the instance's GPU.
    :raises ModelConfigError: an unknown accelerator, parameter or value.
    """
    optional = optional_accelerators(config)
    accelerators = config.optimization.execution_accelerators
    gpu_listed = _listed(config, accelerators.gpu_execution_accelerator, ("tensorrt", "cuda"), "gpu")
    cpu_listed = _listed(config, accelerators.cpu_execution_accelerator, ("openvino",), "cpu")
    gpu_providers: list[Provider] = []
    cuda_parameters: Mapping[str, str] = {}
    for accelerator in gpu_listed:
        if accelerator.name == "tensorrt":
            options = tensorrt_options(config, accelerator.parameters, device_id)
            gpu_providers.append(Provider(TENSORRT, options, "tensorrt", "tensorrt" in optional))
        else:
            cuda_parameters = accelerator.parameters
    gpu_providers.append(Provider(CUDA, cuda_options(config, cuda_parameters, device_id), "cuda"))
    # Checked whatever the kind, but only a GPU instance runs them.
    providers = gpu_providers if kind is InstanceKind.GPU else []
    for accelerator in cpu_listed:
        if accelerator.parameters:
            raise ModelConfigError(
                f"{_where(config, 'openvino')} takes no parameters (it runs with device_type CPU, "
                f"as on Triton); got {', '.join(sorted(accelerator.parameters))}"
            )
        providers.append(Provider(OPENVINO, {"device_type": "CPU"}, "openvino", "openvino" in optional))
    providers.append(Provider(CPU, {}, "cpu"))
    return providers


def missing_reason(provider: Provider, available: Sequence[str], model_name: str, instance: str) -> str:
    """Why `provider` cannot be used: the build lacks it (for the UNAVAILABLE reason or a warning)."""
    if provider.name == CUDA:
        return (
            f"model '{model_name}': instance '{instance}' is KIND_GPU, but this onnxruntime has no CUDA "
            f"provider: {CUDA_INSTALL_HINT}"
        )
    return (
        f"model '{model_name}': execution accelerator '{provider.accelerator}' needs {provider.name}, "
        f"which this onnxruntime build lacks (it has {', '.join(available)})"
    )


def available_providers(
    providers: Sequence[Provider], available: Sequence[str], model_name: str, instance: str
) -> tuple[list[Provider], list[Provider]]:
    """Splits `providers` into those the build has and the optional ones it lacks.

    :param providers: from `plan_providers`.
    :param available: `onnxruntime.get_available_providers()`.
    :param model_name: named in errors.
    :param instance: the instance's name, named in errors.
    :raises UnavailableError: a provider that is not optional is missing.
    """
    kept: list[Provider] = []
    skipped: list[Provider] = []
    for provider in providers:
        if provider.name in available or provider.name == CPU:
            kept.append(provider)
        elif provider.optional:
            skipped.append(provider)
        else:
            reason = missing_reason(provider, available, model_name, instance)
            if provider.name != CUDA:
                reason += (
                    f"; install a build with it, or name '{provider.accelerator}' in parameter "
                    f"'{OPTIONAL_PARAMETER}' to load the model without it"
                )
            raise UnavailableError(reason)
    return kept, skipped
