"""Reading ONNX files with ONNX Runtime (imports onnxruntime: used only once a model loads)."""

from __future__ import annotations

import onnxruntime as ort

from coreserve import DataType, ModelConfig
from coreserve.backend import (
    InstancePlacement,
    InstanceThread,
    ModelFiles,
    ModelSignature,
    ServerContext,
    check_model_tensors,
    complete_config,
    default_max_batch_size,
    inline_below_us,
)
from coreserve_onnx._accelerators import CPU, OPTIONAL_PARAMETER, Provider, missing_reason
from coreserve_onnx._instance import OnnxInstance
from coreserve_onnx._session import open_session, providers_for, session_options, start_session
from coreserve_onnx._tensors import FRAMEWORK, describe, scalars, with_dims


def complete(model: ModelFiles, config: ModelConfig, server: ServerContext) -> ModelConfig:
    """Fills inputs, outputs and max_batch_size from the model file, as Triton does."""
    inspect_options = ort.SessionOptions()
    inspect_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = open_session(model.model_file, inspect_options, [Provider(CPU)], model.name)
    return complete_config(
        config,
        list(describe(session.get_inputs()).values()),
        list(describe(session.get_outputs()).values()),
        model_name=model.name,
        max_batch_size=default_max_batch_size(server, model.name),
    )


def create_instance(
    model: ModelFiles, config: ModelConfig, placement: InstancePlacement, server: ServerContext
) -> OnnxInstance:
    """Opens one session for `placement` (with the configuration's execution accelerators) and
    checks the configuration against the model's tensors."""
    options = session_options(config, server.copies, server.logger)
    providers, missing = providers_for(config, placement, model.name)
    for provider in missing:
        server.logger.warning(
            "%s; instance '%s' runs without it (it is listed in '%s')",
            missing_reason(provider, ort.get_available_providers(), model.name, placement.name),
            placement.name,
            OPTIONAL_PARAMETER,
        )
    session = start_session(model.model_file, options, providers, model.name, placement.name, server.logger)
    signature = ModelSignature(config)
    inputs, outputs = describe(session.get_inputs()), describe(session.get_outputs())
    scalar_inputs = scalars(signature, signature.model_inputs, inputs)
    scalar_outputs = scalars(signature, signature.model_outputs, outputs)
    check_model_tensors(
        signature,
        with_dims(inputs, scalar_inputs),
        with_dims(outputs, scalar_outputs),
        FRAMEWORK,
        unsupported=frozenset({DataType.BF16}),  # onnxruntime's Python API has no bfloat16 arrays
    )
    thread = InstanceThread(placement.name, inline_below_us(config))
    return OnnxInstance(session, signature, thread, frozenset(scalar_inputs), scalar_outputs)
