"""The `tensorflow` backend: SavedModels (`model.savedmodel/`) and frozen GraphDefs (`model.graphdef`).

TensorFlow is imported when a model loads, never when the plugin registers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from coreserve import ModelConfig
from coreserve.backend import InstancePlacement, ModelFiles, ModelInstance, ServerContext


class TensorFlowBackend:
    """Serves TensorFlow models as Triton's TensorFlow backend does, on the devices TensorFlow sees."""

    name: str = "tensorflow"
    platforms: tuple[str, ...] = ("tensorflow_savedmodel", "tensorflow_graphdef")
    default_model_filename: str = "model.savedmodel"

    def usable_gpus(self) -> Sequence[int]:
        """The GPUs TensorFlow sees: none with the CPU build (tensorflow-cpu)."""
        from coreserve_tensorflow.runtime import visible_gpus

        return visible_gpus()

    def auto_complete_config(
        self, model: ModelFiles, config: ModelConfig, server: ServerContext
    ) -> ModelConfig:
        if config.input and config.output:
            from coreserve_tensorflow.layout import platform_of

            config.platform = platform_of(model, config)
            return config
        from coreserve_tensorflow.instance import complete

        return complete(model, config, server)

    async def create_instance(
        self, model: ModelFiles, config: ModelConfig, placement: InstancePlacement, server: ServerContext
    ) -> ModelInstance:
        from coreserve_tensorflow.instance import create_instance

        return await asyncio.to_thread(create_instance, model, config, placement)
