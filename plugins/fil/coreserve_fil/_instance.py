"""Loading a FIL model for one instance, completing its configuration, and running batches.

Imported when a model loads, not when the plugin registers."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from coreserve import DataType, InferenceRequest, ModelConfig, UnsupportedError
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
from coreserve_fil._forests import Forest, load_forest
from coreserve_fil._outputs import INPUT, OUTPUT, Postprocess, output_width, postprocess
from coreserve_fil._settings import FilSettings

FRAMEWORK = "the FIL model"


def _tensors(forest: Forest, settings: FilSettings) -> tuple[ModelTensor, ModelTensor]:
    """`input__0` and `output__0` as Triton's FIL names them: FP32 rows in, FP32 rows out."""
    return (
        ModelTensor(INPUT, DataType.FP32, (-1, forest.num_features)),
        ModelTensor(OUTPUT, DataType.FP32, (-1, output_width(forest, settings))),
    )


def _load(model: ModelFiles, config: ModelConfig) -> tuple[FilSettings, Forest]:
    settings = FilSettings.from_config(config)
    return settings, load_forest(settings.model_file(model), settings, model.name)


def complete(model: ModelFiles, config: ModelConfig, server: ServerContext) -> ModelConfig:
    """Fills `input__0` [features] and `output__0` [width] (FP32) from the model file."""
    if not config.name:
        config.name = model.name  # messages about parameters name the model before the core fills it in
    settings, forest = _load(model, config)
    model_input, model_output = _tensors(forest, settings)
    return complete_config(
        config,
        [model_input],
        [model_output],
        model_name=model.name,
        max_batch_size=default_max_batch_size(server, model.name),
    )


class FilInstance:
    """One loaded forest; batches run on the instance's thread (the predictors release the GIL)."""

    def __init__(self, forest: Forest, finish: Postprocess, thread: InstanceThread) -> None:
        self._forest = forest
        self._finish = finish
        self._thread = thread

    async def execute(self, requests: Sequence[InferenceRequest], responder: Responder) -> None:
        await run_batched(requests, responder, self._run, thread=self._thread)

    def _run(self, inputs: dict[str, np.ndarray], output_names: Sequence[str]) -> dict[str, np.ndarray]:
        rows = inputs[INPUT]
        scores = self._forest.predict(rows.reshape(len(rows), -1))
        return {OUTPUT: self._finish(scores)}

    async def close(self) -> None:
        self._thread.close()


def create_instance(model: ModelFiles, config: ModelConfig, placement: InstancePlacement) -> FilInstance:
    """Reads the forest for one instance (blocking: run it on a worker thread)."""
    if placement.kind is InstanceKind.GPU:
        raise UnsupportedError(
            f"model '{model.name}': plugin-fil predicts on the CPU; instance '{placement.name}' is KIND_GPU "
            "(use KIND_CPU, or KIND_AUTO)"
        )
    settings, forest = _load(model, config)
    model_input, model_output = _tensors(forest, settings)
    check_model_tensors(ModelSignature(config), {INPUT: model_input}, {OUTPUT: model_output}, FRAMEWORK)
    thread = InstanceThread(placement.name, inline_below_us(config))
    return FilInstance(forest, postprocess(forest, settings), thread)
