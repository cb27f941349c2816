"""Creating ONNX Runtime sessions from a model configuration's parameters and optimization policy."""

from __future__ import annotations

from pathlib import Path

import onnxruntime as ort

from coreserve import ModelConfig, ModelConfigError, UnavailableError
from coreserve.backend import InstanceKind, InstancePlacement, bool_parameter, int_parameter

# optimization { graph { level } } as Triton's ONNX Runtime backend reads it.
_GRAPH_LEVELS = {
    0: ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    -1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    2: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
}


def session_options(config: ModelConfig) -> ort.SessionOptions:
    """SessionOptions from `parameters` and `optimization.graph.level`; bad values name the model."""
    options = ort.SessionOptions()
    intra = int_parameter(config, "intra_op_thread_count")
    if intra is not None:
        options.intra_op_num_threads = intra
    inter = int_parameter(config, "inter_op_thread_count")
    if inter is not None:
        options.inter_op_num_threads = inter
    mode = int_parameter(config, "execution_mode")
    if mode is not None:
        if mode not in (0, 1):
            raise ModelConfigError(
                f"model '{config.name}': parameter 'execution_mode' must be 0 (sequential) or 1 (parallel)"
            )
        options.execution_mode = ort.ExecutionMode.ORT_PARALLEL if mode else ort.ExecutionMode.ORT_SEQUENTIAL
    arena = bool_parameter(config, "enable_mem_arena")
    if arena is not None:
        options.enable_cpu_mem_arena = arena
    pattern = bool_parameter(config, "enable_mem_pattern")
    if pattern is not None:
        options.enable_mem_pattern = pattern
    # Spinning intra-op threads take CPU from the server's event loop; a server wants them idle.
    spinning = bool_parameter(config, "allow_spinning")
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    level = config.optimization.graph.level
    if level not in _GRAPH_LEVELS:
        raise ModelConfigError(
            f"model '{config.name}': config field 'optimization.graph.level' must be one of "
            f"{sorted(_GRAPH_LEVELS)}, got {level}"
        )
    options.graph_optimization_level = _GRAPH_LEVELS[level]
    return options


def providers_for(placement: InstancePlacement) -> list[str | tuple[str, dict[str, str]]]:
    if placement.kind is not InstanceKind.GPU:
        return ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise UnavailableError(
            f"instance '{placement.name}' is KIND_GPU, but this onnxruntime has no CUDA provider: "
            "install the GPU build (pip uninstall onnxruntime && pip install 'plugin-onnx[gpu]')"
        )
    return [("CUDAExecutionProvider", {"device_id": str(placement.device_id)}), "CPUExecutionProvider"]


def open_session(
    path: Path,
    options: ort.SessionOptions,
    providers: list[str | tuple[str, dict[str, str]]],
    model_name: str,
) -> ort.InferenceSession:
    """Loads an ONNX model; a missing or unreadable file gives an error naming it."""
    if path.is_dir():  # Triton also accepts a model.onnx folder holding model.onnx and its weights
        path = path / "model.onnx"
    if not path.is_file():
        raise ModelConfigError(f"model '{model_name}': model file {path} not found")
    try:
        return ort.InferenceSession(str(path), sess_options=options, providers=providers)
    except Exception as exc:
        raise ModelConfigError(f"model '{model_name}': onnxruntime cannot load {path}: {exc}") from None
