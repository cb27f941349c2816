"""The `openvino` backend: models that OpenVINO reads, compiled for the CPU or OpenVINO's GPUs.

OpenVINO is imported when a model loads, not when the plugin registers.
"""

from __future__ import annotations

from collections.abc import Sequence

from coreserve import ModelConfig
from coreserve.backend import BaseBackend, InstancePlacement, ModelFiles, ModelInstance, ServerContext


class OpenVinoBackend(BaseBackend):
    """Serves models that OpenVINO reads, compiled for the CPU (KIND_CPU) or for the GPU
    device of OpenVINO's GPU plugin with the instance's number (KIND_GPU)."""

    name: str = "openvino"
    platforms: tuple[str, ...] = ("openvino",)
    default_model_filename: str = "model.xml"

    def usable_gpus(self) -> Sequence[int]:
        """The devices of OpenVINO's GPU plugin (Intel GPUs); none on most servers."""
        from coreserve_openvino._runtime import visible_gpus

        return visible_gpus()

    def complete_config(self, model: ModelFiles, config: ModelConfig, server: ServerContext) -> ModelConfig:
        from coreserve_openvino._runtime import complete

        return complete(model, config, server)

    def load_instance(
        self, model: ModelFiles, config: ModelConfig, placement: InstancePlacement, server: ServerContext
    ) -> ModelInstance:
        from coreserve_openvino._runtime import create_instance

        return create_instance(model, config, placement)
