"""The `onnxruntime` backend: auto-completes configurations from ONNX files and creates instances.

onnxruntime is imported when a model loads, not when the plugin registers.
"""

from __future__ import annotations

from coreserve import ModelConfig
from coreserve.backend import BaseBackend, InstancePlacement, ModelFiles, ModelInstance, ServerContext


class OnnxBackend(BaseBackend):
    """Serves ONNX models with ONNX Runtime, one InferenceSession per instance."""

    name: str = "onnxruntime"
    platforms: tuple[str, ...] = ("onnxruntime_onnx",)
    default_model_filename: str = "model.onnx"

    def complete_config(self, model: ModelFiles, config: ModelConfig, server: ServerContext) -> ModelConfig:
        from coreserve_onnx.loading import complete

        return complete(model, config, server)

    def load_instance(
        self, model: ModelFiles, config: ModelConfig, placement: InstancePlacement, server: ServerContext
    ) -> ModelInstance:
        from coreserve_onnx.loading import create_instance

        return create_instance(model, config, placement)
