"""The `openvino` backend: models that OpenVINO reads, compiled for the CPU.

OpenVINO is imported when a model loads, not when the plugin registers.
"""

from __future__ import annotations

import asyncio

from coreserve import ModelConfig
from coreserve.backend import InstancePlacement, ModelFiles, ModelInstance, ServerContext


class OpenVinoBackend:
    """Serves models that OpenVINO reads, compiled for the CPU."""

    name: str = "openvino"
    platforms: tuple[str, ...] = ("openvino",)
    default_model_filename: str = "model.xml"

    def auto_complete_config(
        self, model: ModelFiles, config: ModelConfig, server: ServerContext
    ) -> ModelConfig:
        if config.input and config.output:
            return config
        from coreserve_openvino.runtime import complete

        return complete(model, config, server)

    async def create_instance(
        self, model: ModelFiles, config: ModelConfig, placement: InstancePlacement, server: ServerContext
    ) -> ModelInstance:
        from coreserve_openvino.runtime import create_instance

        return await asyncio.to_thread(create_instance, model, config, placement)
