"""The `tensorrt` backend: serialized engines (model.plan) on NVIDIA GPUs."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from coreserve import ModelConfig, ModelConfigError, UnavailableError
from coreserve.backend import (
    BaseBackend,
    InstanceKind,
    InstancePlacement,
    InstanceThread,
    ModelFiles,
    ModelInstance,
    ModelSignature,
    ModelTensor,
    ServerContext,
    check_model_tensors,
    complete_config,
    default_max_batch_size,
)
from coreserve_tensorrt._runtime import datatypes, import_cudart, import_tensorrt, visible_gpus

FRAMEWORK = "the TensorRT engine"


def load_engine(trt: Any, model: ModelFiles) -> Any:
    if not model.model_file.is_file():
        raise ModelConfigError(f"model '{model.name}': model file {model.model_file} not found")
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    engine = runtime.deserialize_cuda_engine(model.model_file.read_bytes())
    if engine is None:
        raise ModelConfigError(
            f"model '{model.name}': TensorRT cannot deserialize {model.model_file} (built for another "
            "TensorRT version or GPU?)"
        )
    return engine


def engine_tensors(trt: Any, engine: Any) -> tuple[dict[str, ModelTensor], dict[str, ModelTensor]]:
    types = datatypes(trt)
    inputs: dict[str, ModelTensor] = {}
    outputs: dict[str, ModelTensor] = {}
    for index in range(engine.num_io_tensors):
        name = engine.get_tensor_name(index)
        dtype = engine.get_tensor_dtype(name)
        tensor = ModelTensor(
            name, types.get(dtype), tuple(int(d) for d in engine.get_tensor_shape(name)), str(dtype)
        )
        target = inputs if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT else outputs
        target[name] = tensor
    return inputs, outputs


class TensorRTBackend(BaseBackend):
    """Serves TensorRT engines; TensorRT and CUDA are imported when a model loads."""

    name: str = "tensorrt"
    platforms: tuple[str, ...] = ("tensorrt_plan",)
    default_model_filename: str = "model.plan"

    def usable_gpus(self) -> Sequence[int]:
        """Every GPU CUDA sees: a plan without instance_group runs on each, as on Triton."""
        return visible_gpus()

    def complete_config(self, model: ModelFiles, config: ModelConfig, server: ServerContext) -> ModelConfig:
        try:
            trt = import_tensorrt(model.name)
            import_cudart(model.name)
        except UnavailableError:
            return config  # loading the model reports what is missing
        inputs, outputs = engine_tensors(trt, load_engine(trt, model))
        return complete_config(
            config,
            list(inputs.values()),
            list(outputs.values()),
            model_name=model.name,
            max_batch_size=default_max_batch_size(server, model.name),
        )

    async def create_instance(
        self, model: ModelFiles, config: ModelConfig, placement: InstancePlacement, server: ServerContext
    ) -> ModelInstance:
        trt = import_tensorrt(model.name)
        cudart = import_cudart(model.name)
        if placement.kind is InstanceKind.CPU:
            raise ModelConfigError(f"model '{model.name}': TensorRT engines run on GPUs; use KIND_GPU")
        from coreserve_tensorrt._instance import TensorRTInstance

        engine = await asyncio.to_thread(load_engine, trt, model)
        signature = ModelSignature(config)
        inputs, outputs = engine_tensors(trt, engine)
        check_model_tensors(signature, inputs, outputs, FRAMEWORK)
        # GPU work is never quick enough to be worth blocking the event loop: always the thread.
        thread = InstanceThread(placement.name, inline_below_us=0)
        instance = TensorRTInstance(trt, cudart, engine, placement.device_id, signature, thread)
        await thread.run(instance.prepare)
        return instance
