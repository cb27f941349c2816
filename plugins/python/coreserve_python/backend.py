"""The `python` backend: Triton Python models, each instance in a stub process of its own."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from coreserve import ModelConfig, ModelConfigError, config_from_dict, config_to_dict
from coreserve.backend import (
    BaseBackend,
    InstancePlacement,
    ModelFiles,
    ModelInstance,
    ServerContext,
    cuda_driver_gpus,
)
from coreserve_python.environment import stub_launch
from coreserve_python.instance import PythonInstance
from coreserve_python.messages import AutoCompleteMessage
from coreserve_python.process import run_once

AUTO_COMPLETE_TIMEOUT_S = 120.0
FORCE_CPU_ONLY_INPUT_TENSORS = "FORCE_CPU_ONLY_INPUT_TENSORS"
# coreserve's parameter: how many executions a stub may be handed ahead (see PythonInstance).
PIPELINE_DEPTH = "pipeline_depth"
DEFAULT_PIPELINE_DEPTH = 8
MAX_PIPELINE_DEPTH = 64


def check_input_memory_parameter(config: ModelConfig) -> None:
    """FORCE_CPU_ONLY_INPUT_TENSORS takes "yes" or "no", as on Triton (its load error, stray quote
    included). Inputs reach a model in host memory with either: the server holds them there."""
    entry = config.parameters.get(FORCE_CPU_ONLY_INPUT_TENSORS)
    if entry is not None and entry.string_value not in ("yes", "no"):
        raise ModelConfigError(f"Incorrect value for {FORCE_CPU_ONLY_INPUT_TENSORS}: {entry.string_value}'")


def pipeline_depth(config: ModelConfig) -> int:
    """The `pipeline_depth` parameter: a whole number from 1 (no execution handed ahead) to 64."""
    entry = config.parameters.get(PIPELINE_DEPTH)
    if entry is None:
        return DEFAULT_PIPELINE_DEPTH
    text = entry.string_value.strip()
    if not text.isdigit() or not 1 <= int(text) <= MAX_PIPELINE_DEPTH:
        raise ModelConfigError(
            f"parameter {PIPELINE_DEPTH} must be a whole number from 1 to {MAX_PIPELINE_DEPTH}, got '{text}'"
        )
    return int(text)


class PythonBackend(BaseBackend):
    """Serves `model.py` files that define `TritonPythonModel`."""

    name: str = "python"
    platforms: tuple[str, ...] = ()
    default_model_filename: str = "model.py"

    def usable_gpus(self) -> Sequence[int]:
        """The GPUs the CUDA driver shows: as on Triton (whose python backend prefers GPU
        instances where there are GPUs), a model without instance_group gets an instance on
        each, and the model sees its kind and device in `args`; none here means CPU."""
        return cuda_driver_gpus()

    def auto_complete_config(
        self, model: ModelFiles, config: ModelConfig, server: ServerContext
    ) -> ModelConfig:
        """Runs the model's static `auto_complete_config(config)` in a short-lived stub."""
        self.check_model_file(model)
        message: AutoCompleteMessage = {
            "op": "auto_complete",
            "model_file": str(model.model_file),
            "config": config_to_dict(config),
        }
        launch = stub_launch(config, model.name, model.path)
        reply = run_once(launch, message, "auto_complete_done", AUTO_COMPLETE_TIMEOUT_S)
        if reply["error"] is not None:
            raise ModelConfigError(f"model '{model.name}': auto_complete_config() failed:\n{reply['error']}")
        return config_from_dict(reply["config"], source=f"model '{model.name}' auto_complete_config()")

    async def create_instance(
        self, model: ModelFiles, config: ModelConfig, placement: InstancePlacement, server: ServerContext
    ) -> ModelInstance:
        self.check_model_file(model)
        check_input_memory_parameter(config)
        depth = pipeline_depth(config)
        # Unpacking a packed environment takes seconds: not on the event loop.
        launch = await asyncio.to_thread(stub_launch, config, model.name, model.path)
        instance = PythonInstance(launch, model, config, placement, server, pipeline_depth=depth)
        await instance.start()
        return instance
