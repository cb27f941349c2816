"""The `onnxruntime` backend: auto-completes configurations from ONNX files and creates instances."""

from __future__ import annotations

import asyncio

import onnxruntime as ort

from coreserve import DataType, ModelConfig
from coreserve.backend import (
    InstancePlacement,
    InstanceThread,
    ModelFiles,
    ModelInstance,
    ModelSignature,
    ServerContext,
    check_model_tensors,
    complete_config,
    default_max_batch_size,
    inline_below_us,
)
from coreserve_onnx.instance import OnnxInstance
from coreserve_onnx.session import open_session, providers_for, session_options
from coreserve_onnx.tensors import FRAMEWORK, describe


class OnnxBackend:
    """Serves ONNX models with ONNX Runtime, one InferenceSession per instance."""

    name: str = "onnxruntime"
    platforms: tuple[str, ...] = ("onnxruntime_onnx",)
    default_model_filename: str = "model.onnx"

    def auto_complete_config(
        self, model: ModelFiles, config: ModelConfig, server: ServerContext
    ) -> ModelConfig:
        """Fills inputs, outputs and max_batch_size from the model file, as Triton does."""
        if config.input and config.output:
            return config
        inspect_options = ort.SessionOptions()
        inspect_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = open_session(model.model_file, inspect_options, ["CPUExecutionProvider"], model.name)
        return complete_config(
            config,
            list(describe(session.get_inputs()).values()),
            list(describe(session.get_outputs()).values()),
            model_name=model.name,
            max_batch_size=default_max_batch_size(server, model.name),
        )

    async def create_instance(
        self, model: ModelFiles, config: ModelConfig, placement: InstancePlacement, server: ServerContext
    ) -> ModelInstance:
        options = session_options(config)
        providers = providers_for(placement)
        session = await asyncio.to_thread(open_session, model.model_file, options, providers, model.name)
        signature = ModelSignature(config)
        check_model_tensors(
            signature,
            describe(session.get_inputs()),
            describe(session.get_outputs()),
            FRAMEWORK,
            unsupported=frozenset({DataType.BF16}),  # onnxruntime's Python API has no bfloat16 arrays
        )
        thread = InstanceThread(placement.name, inline_below_us(config))
        return OnnxInstance(session, signature, thread)
