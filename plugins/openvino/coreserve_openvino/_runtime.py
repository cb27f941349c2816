"""OpenVINO itself: reading, reshaping and compiling models, and the instances that run them.

Imported when a model loads, not when the plugin registers."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov

from coreserve import (
    DataType,
    InferenceRequest,
    ModelConfig,
    ModelConfigError,
    UnavailableError,
)
from coreserve.backend import (
    InstanceKind,
    InstancePlacement,
    InstanceThread,
    ModelFiles,
    ModelSignature,
    ModelTensor,
    Responder,
    ServerContext,
    check_model_tensors,
    choice_parameter,
    complete_config,
    default_max_batch_size,
    inline_below_us,
    int_parameter,
    run_batched,
    str_parameter,
)

FRAMEWORK = "the OpenVINO model"
OV_TYPES = {
    "boolean": DataType.BOOL,
    "u8": DataType.UINT8,
    "u16": DataType.UINT16,
    "u32": DataType.UINT32,
    "u64": DataType.UINT64,
    "i8": DataType.INT8,
    "i16": DataType.INT16,
    "i32": DataType.INT32,
    "i64": DataType.INT64,
    "f16": DataType.FP16,
    "f32": DataType.FP32,
    "f64": DataType.FP64,
    "bf16": DataType.BF16,
}
HINTS = ("LATENCY", "THROUGHPUT", "CUMULATIVE_THROUGHPUT")
# CPUs with bfloat16 units compute in bf16 unless told otherwise; f32 keeps a model's precision.
PRECISIONS = ("f32", "bf16", "f16")


def _tensors(ports: Sequence[Any]) -> dict[str, ModelTensor]:
    tensors = {}
    for port in ports:
        type_name = port.get_element_type().get_type_name()
        shape = port.get_partial_shape()
        dims = (
            tuple(-1 if dim.is_dynamic else dim.get_length() for dim in shape) if shape.rank.is_static else ()
        )
        tensors[port.get_any_name()] = ModelTensor(
            port.get_any_name(), OV_TYPES.get(type_name), dims, type_name
        )
    return tensors


def read_model(core: ov.Core, path: Path, model_name: str) -> ov.Model:
    if not path.is_file():
        raise ModelConfigError(f"model '{model_name}': model file {path} not found")
    try:
        return core.read_model(str(path))
    except Exception as exc:  # OpenVINO raises RuntimeError subclasses of its own
        raise ModelConfigError(f"model '{model_name}': OpenVINO cannot read {path}: {exc}") from None


def compile_options(config: ModelConfig) -> dict[str, str]:
    options: dict[str, str] = {}
    hint = choice_parameter(config, "PERFORMANCE_HINT", HINTS)
    if hint is not None:
        options["PERFORMANCE_HINT"] = hint
    streams = str_parameter(config, "NUM_STREAMS")
    if streams is not None:
        if streams.upper() != "AUTO":
            int_parameter(config, "NUM_STREAMS", minimum=1)
        options["NUM_STREAMS"] = streams.upper()
    threads = int_parameter(config, "INFERENCE_NUM_THREADS", minimum=1)
    if threads is not None:
        options["INFERENCE_NUM_THREADS"] = str(threads)
    precision = choice_parameter(config, "INFERENCE_PRECISION_HINT", PRECISIONS)
    if precision is not None:
        options["INFERENCE_PRECISION_HINT"] = precision
    return options


def _with_dynamic_batch(network: ov.Model, model_name: str) -> ov.Model:
    """Makes the first dimension of every input dynamic, so that batches of any size fit."""
    shapes = {}
    for port in network.inputs:
        shape = port.get_partial_shape()
        if shape.rank.is_static and len(shape) > 0 and shape[0].is_static:
            dims = [ov.Dimension() if index == 0 else dim for index, dim in enumerate(shape)]
            shapes[port.get_any_name()] = ov.PartialShape(dims)
    if shapes:
        try:
            network.reshape(shapes)
        except Exception as exc:
            raise ModelConfigError(
                f"model '{model_name}': max_batch_size > 0 needs a dynamic first dimension, and OpenVINO "
                f"cannot reshape the model to one: {exc}"
            ) from None
    return network


class OpenVinoInstance:
    """One compiled model and its infer request, run on the instance's thread (it releases the GIL)."""

    def __init__(self, compiled: ov.CompiledModel, thread: InstanceThread) -> None:
        self._compiled = compiled
        self._request = compiled.create_infer_request()
        self._thread = thread
        self._outputs = {port.get_any_name(): port for port in compiled.outputs}

    async def execute(self, requests: Sequence[InferenceRequest], responder: Responder) -> None:
        await run_batched(requests, responder, self._run, thread=self._thread)

    def _run(self, inputs: dict[str, np.ndarray], output_names: Sequence[str]) -> dict[str, np.ndarray]:
        results = self._request.infer(inputs)
        return {name: np.array(results[self._outputs[name]]) for name in output_names}

    async def close(self) -> None:
        self._thread.close()
        del self._request, self._compiled


_CORE: ov.Core | None = None


def core() -> ov.Core:
    global _CORE
    if _CORE is None:
        _CORE = ov.Core()
    return _CORE


def complete(model: ModelFiles, config: ModelConfig, server: ServerContext) -> ModelConfig:
    network = read_model(core(), model.model_file, model.name)
    return complete_config(
        config,
        list(_tensors(network.inputs).values()),
        list(_tensors(network.outputs).values()),
        model_name=model.name,
        max_batch_size=default_max_batch_size(server, model.name),
    )


def visible_gpus() -> list[int]:
    """The GPUs OpenVINO's GPU plugin sees ("GPU" alone is GPU.0); none without one."""
    ids = []
    for device in core().available_devices:
        kind, _, index = device.partition(".")
        if kind == "GPU":
            ids.append(int(index) if index.isdigit() else 0)
    return ids


def create_instance(model: ModelFiles, config: ModelConfig, placement: InstancePlacement) -> OpenVinoInstance:
    """Reads and compiles the model for one instance (blocking: run it on a worker thread)."""
    # A GPU instance runs on OpenVINO's GPU plugin device of the same number.
    device = f"GPU.{placement.device_id}" if placement.kind is InstanceKind.GPU else "CPU"
    signature = ModelSignature(config)
    network = read_model(core(), model.model_file, model.name)
    if signature.batching:
        network = _with_dynamic_batch(network, model.name)
    check_model_tensors(signature, _tensors(network.inputs), _tensors(network.outputs), FRAMEWORK)
    options = compile_options(config)
    try:
        compiled = core().compile_model(network, device, options)
    except Exception as exc:
        raise UnavailableError(
            f"model '{model.name}': OpenVINO cannot compile it for {device}: {exc}"
        ) from None
    return OpenVinoInstance(compiled, InstanceThread(placement.name, inline_below_us(config)))
