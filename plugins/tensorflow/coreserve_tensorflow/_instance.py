"""Completing a TensorFlow model's configuration, loading its instances and running batches.

Imported when a model loads, not when the plugin registers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from coreserve import InferenceRequest, ModelConfig, ModelConfigError
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
    complete_config,
    default_max_batch_size,
    inline_below_us,
    run_batched,
)
from coreserve_tensorflow._layout import GRAPHDEF, model_path, platform_of
from coreserve_tensorflow._models import TensorFlowModel, load_graphdef, load_savedmodel
from coreserve_tensorflow._runtime import apply_thread_pools, tf


def _load(model: ModelFiles, config: ModelConfig) -> TensorFlowModel:
    path = model_path(model, config)
    if platform_of(model, config) == GRAPHDEF:
        return load_graphdef(path, config, model.name)
    return load_savedmodel(path, config, model.name)


def complete(model: ModelFiles, config: ModelConfig, server: ServerContext) -> ModelConfig:
    """Fills platform, inputs, outputs and max_batch_size from a SavedModel's signature; a
    GraphDef carries too little to complete from, so its configuration must list them."""
    config.platform = platform_of(model, config)
    if config.platform == GRAPHDEF:
        return config
    if not config.name:
        config.name = model.name  # messages about parameters name the model before the core fills it in
    loaded = _load(model, config)
    inputs, outputs = loaded.model_tensors("input"), loaded.model_tensors("output")
    listed = {tensor.name for tensor in config.input} | {tensor.name for tensor in config.output}
    for name, (_, dims) in [*loaded.inputs.items(), *loaded.outputs.items()]:
        if dims is None and name not in listed:
            raise ModelConfigError(
                f"model '{model.name}': the SavedModel does not tell the rank of tensor '{name}'; "
                "list it with its dims in config.pbtxt"
            )
    config = complete_config(
        config,
        list(inputs.values()),
        list(outputs.values()),
        model_name=model.name,
        max_batch_size=default_max_batch_size(server, model.name),
    )
    if config.max_batch_size > 0:
        # A [batch] tensor is one value per batch item: dims [1] reshaped to a scalar, as Triton writes it.
        for tensor in config.input:
            _batch_item_scalar(tensor)
        for output in config.output:
            _batch_item_scalar(output)
    return config


def _batch_item_scalar(tensor: Any) -> None:
    """Gives a dimensionless tensor of a batching model dims [1] reshaped to a scalar."""
    if not tensor.dims and not tensor.HasField("reshape"):
        tensor.dims.append(1)
        tensor.reshape.SetInParent()


def _checked_tensors(
    loaded: TensorFlowModel, signature: ModelSignature, which: str
) -> dict[str, ModelTensor]:
    """The model's tensors, those of unknown rank taking the configuration's shape."""
    tensors = loaded.model_tensors(which)
    specs = signature.model_inputs if which == "input" else signature.model_outputs
    dims_known = loaded.inputs if which == "input" else loaded.outputs
    for name, (_, dims) in dims_known.items():
        if dims is None and name in specs:
            shape = tuple(specs[name].dims)
            tensors[name] = ModelTensor(
                name, tensors[name].datatype, (-1, *shape) if signature.batching else shape
            )
    return tensors


class TensorFlowInstance:
    """One loaded model on its device; batches run on the instance's thread."""

    def __init__(self, loaded: TensorFlowModel, device: str, thread: InstanceThread) -> None:
        self._loaded = loaded
        self._device = device
        self._thread = thread
        self._dtypes = {name: dtype for name, (dtype, _) in loaded.inputs.items()}

    async def execute(self, requests: Sequence[InferenceRequest], responder: Responder) -> None:
        await run_batched(requests, responder, self._run, thread=self._thread)

    def _run(self, inputs: dict[str, np.ndarray], output_names: Sequence[str]) -> dict[str, np.ndarray]:
        with tf.device(self._device):
            feeds = {name: tf.constant(array, dtype=self._dtypes[name]) for name, array in inputs.items()}
            results: Any = self._loaded.run(feeds)
            return {name: results[name].numpy() for name in output_names}

    async def close(self) -> None:
        self._thread.close()
        del self._loaded


def create_instance(
    model: ModelFiles, config: ModelConfig, placement: InstancePlacement
) -> TensorFlowInstance:
    """Loads the model for one instance on its device (blocking: run it on a worker thread)."""
    apply_thread_pools(config)
    device = f"/GPU:{placement.device_id}" if placement.kind is InstanceKind.GPU else "/CPU:0"
    with tf.device(device):
        loaded = _load(model, config)
    signature = ModelSignature(config)
    framework = "the GraphDef" if platform_of(model, config) == GRAPHDEF else "the SavedModel"
    check_model_tensors(
        signature,
        _checked_tensors(loaded, signature, "input"),
        _checked_tensors(loaded, signature, "output"),
        framework,
    )
    return TensorFlowInstance(loaded, device, InstanceThread(placement.name, inline_below_us(config)))
