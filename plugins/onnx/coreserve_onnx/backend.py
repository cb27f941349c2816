"""The `onnxruntime` backend: auto-completes configurations from ONNX files and creates instances."""

from __future__ import annotations

import asyncio

import onnxruntime as ort

from coreserve import DataType, ModelConfig, ModelConfigError
from coreserve.backend import (
    InstancePlacement,
    InstanceThread,
    ModelFiles,
    ModelInstance,
    ModelSignature,
    ServerContext,
)
from coreserve_onnx.instance import OnnxInstance
from coreserve_onnx.session import inline_below_us, open_session, providers_for, session_options
from coreserve_onnx.signature import check_signature
from coreserve_onnx.tensors import OnnxTensor, describe

DEFAULT_MAX_BATCH_SIZE = 4


class OnnxBackend:
    """Serves ONNX models with ONNX Runtime, one InferenceSession per instance."""

    name: str = "onnxruntime"
    platforms: tuple[str, ...] = ("onnxruntime_onnx",)
    default_model_filename: str = "model.onnx"

    def auto_complete_config(
        self, model: ModelFiles, config: ModelConfig, server: ServerContext
    ) -> ModelConfig:
        """Fills inputs, outputs and max_batch_size from the model file, as Triton does.

        A model whose every input and output has a dynamic first dimension gets
        max_batch_size = `default-max-batch-size` (4) and the dynamic batcher, unless the
        configuration lists its inputs or outputs itself.
        """
        if config.input and config.output:
            return config
        inspect_options = ort.SessionOptions()
        inspect_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = open_session(model.model_file, inspect_options, ["CPUExecutionProvider"], model.name)
        inputs, outputs = describe(session.get_inputs()), describe(session.get_outputs())
        tensors = [*inputs.values(), *outputs.values()]
        batchable = bool(tensors) and all(t.dims and t.dims[0] == -1 for t in tensors)
        if not config.input and not config.output and config.max_batch_size == 0 and batchable:
            config.max_batch_size = _default_max_batch_size(server, model.name)
            if config.max_batch_size > 0 and config.WhichOneof("scheduling_choice") is None:
                config.dynamic_batching.SetInParent()
        skip = 1 if config.max_batch_size > 0 else 0
        if not config.input:
            for tensor in inputs.values():
                config.input.add(
                    name=tensor.name, data_type=_config_type(tensor, model.name), dims=tensor.dims[skip:]
                )
        if not config.output:
            for tensor in outputs.values():
                config.output.add(
                    name=tensor.name, data_type=_config_type(tensor, model.name), dims=tensor.dims[skip:]
                )
        return config

    async def create_instance(
        self, model: ModelFiles, config: ModelConfig, placement: InstancePlacement, server: ServerContext
    ) -> ModelInstance:
        options = session_options(config)
        providers = providers_for(placement)
        session = await asyncio.to_thread(open_session, model.model_file, options, providers, model.name)
        signature = ModelSignature(config)
        check_signature(signature, describe(session.get_inputs()), describe(session.get_outputs()))
        thread = InstanceThread(placement.name, inline_below_us(config))
        return OnnxInstance(session, signature, thread)


def _config_type(tensor: OnnxTensor, model_name: str) -> int:
    datatype = tensor.datatype
    if datatype is None:
        raise ModelConfigError(
            f"model '{model_name}': tensor '{tensor.name}' has type {tensor.ort_type}, "
            "which coreserve cannot serve"
        )
    return DataType(datatype).config_value


def _default_max_batch_size(server: ServerContext, model_name: str) -> int:
    value = server.backend_config.get("default-max-batch-size", str(DEFAULT_MAX_BATCH_SIZE))
    try:
        return max(0, int(value))
    except ValueError:
        raise ModelConfigError(
            f"model '{model_name}': backend setting default-max-batch-size must be an integer, got '{value}'"
        ) from None
