"""The `pytorch` backend: TorchScript and torch.export models, one module per instance.

torch is imported when a model loads, not when the plugin registers.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from coreserve import ModelConfig
from coreserve.backend import InstancePlacement, ModelFiles, ModelInstance, ServerContext

EXPORT_SUFFIX = ".pt2"


class TorchBackend:
    """Serves TorchScript (`model.pt`) and torch.export (`model.pt2`) models."""

    name: str = "pytorch"
    platforms: tuple[str, ...] = ("pytorch_libtorch",)
    default_model_filename: str = "model.pt"

    def auto_complete_config(
        self, model: ModelFiles, config: ModelConfig, server: ServerContext
    ) -> ModelConfig:
        """Completes configurations of torch.export programs; TorchScript files carry no shapes."""
        if (config.input and config.output) or Path(model.filename).suffix != EXPORT_SUFFIX:
            return config
        if not model.model_file.is_file():
            return config  # loading the model reports the missing file
        from coreserve_torch.loading import complete_from_export

        return complete_from_export(model, config, server)

    async def create_instance(
        self, model: ModelFiles, config: ModelConfig, placement: InstancePlacement, server: ServerContext
    ) -> ModelInstance:
        from coreserve_torch.loading import create_instance

        return await asyncio.to_thread(create_instance, model, config, placement)
