"""Creating ONNX Runtime sessions from a model configuration's parameters and optimization policy."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

import onnxruntime as ort

from coreserve import ModelConfig, ModelConfigError, UnavailableError
from coreserve.backend import InstancePlacement, bool_parameter, int_parameter
from coreserve_onnx._accelerators import Provider, available_providers, plan_providers

# optimization { graph { level } } as Triton's ONNX Runtime backend reads it.
_GRAPH_LEVELS = {
    0: ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    -1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    2: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
}


def session_options(
    config: ModelConfig, copies: int = 1, logger: logging.Logger | None = None
) -> ort.SessionOptions:
    """SessionOptions from `parameters` and `optimization.graph.level`; bad values name the model.

    `copies`: the copies of the model the server loads (`ServerContext.copies`). Where there are
    several and the configuration sets no `intra_op_thread_count`, each gets its share of the
    cores, not ONNX Runtime's default of all of them: copies that each take every core slow
    one another down (benchmarks/workers/workers.py, compute-binary).
    """
    options = ort.SessionOptions()
    intra = int_parameter(config, "intra_op_thread_count")
    if intra is None and copies > 1:
        intra = max(1, len(os.sched_getaffinity(0)) // copies)
        (logger or logging.getLogger(__name__)).info(
            "model '%s': %d intra-op thread(s) per instance, the share of %d copies of it on this machine's "
            "cores (parameter intra_op_thread_count sets it)",
            config.name,
            intra,
            copies,
        )
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


def providers_for(
    config: ModelConfig, placement: InstancePlacement, model_name: str
) -> tuple[list[Provider], list[Provider]]:
    """The providers for one instance that this onnxruntime build has, and the optional ones it lacks.

    :raises ModelConfigError: an unknown accelerator, parameter or value.
    :raises UnavailableError: a provider that is not optional is missing.
    """
    planned = plan_providers(config, placement.kind, placement.device_id)
    return available_providers(planned, ort.get_available_providers(), model_name, placement.name)


def open_session(
    path: Path,
    options: ort.SessionOptions,
    providers: Sequence[Provider],
    model_name: str,
) -> ort.InferenceSession:
    """Loads an ONNX model; a missing or unreadable file gives an error naming it."""
    if path.is_dir():  # Triton also accepts a model.onnx folder holding model.onnx and its weights
        path = path / "model.onnx"
    if not path.is_file():
        raise ModelConfigError(f"model '{model_name}': model file {path} not found")
    try:
        # No silent fallback to other providers: a provider that fails must say so.
        return ort.InferenceSession(
            str(path), sess_options=options, providers=[p.as_ort() for p in providers], enable_fallback=0
        )
    except Exception as exc:
        raise ModelConfigError(f"model '{model_name}': onnxruntime cannot load {path}: {exc}") from None


def start_session(
    path: Path,
    options: ort.SessionOptions,
    providers: Sequence[Provider],
    model_name: str,
    instance: str,
    logger: logging.Logger,
) -> ort.InferenceSession:
    """Opens the session of one instance, and checks that each provider it asked for runs.

    An optional accelerator whose provider fails to start is left out (one warning); one that
    is not optional makes the instance UNAVAILABLE.
    """
    try:
        session = open_session(path, options, providers, model_name)
    except ModelConfigError as exc:
        optional = [p for p in providers if p.optional]
        if not optional:
            raise
        providers = [p for p in providers if not p.optional]
        # A fault of the model itself fails again here, and is reported as it is.
        session = open_session(path, options, providers, model_name)
        logger.warning(
            "model '%s': instance '%s' runs without %s: %s",
            model_name,
            instance,
            ", ".join(p.name for p in optional),
            exc.message,
        )
    active = session.get_providers()
    for provider in providers:
        if provider.name in active:
            continue
        # onnxruntime logs why it dropped a provider (a driver or library missing) and goes on.
        reason = (
            f"model '{model_name}': onnxruntime did not start {provider.name} for instance "
            f"'{instance}' (its log says why); the session has {', '.join(active)}"
        )
        if not provider.optional:
            raise UnavailableError(reason)
        logger.warning("%s; running without it", reason)
    logger.info("model '%s': instance '%s' runs on %s", model_name, instance, ", ".join(active))
    return session
