"""The `onnxruntime` backend: auto-completes configurations from ONNX files and creates instances.

onnxruntime is imported when a model loads, not when the plugin registers.
"""

from __future__ import annotations

from collections.abc import Sequence

from coreserve import ModelConfig
from coreserve.backend import (
    BaseBackend,
    InstancePlacement,
    ModelFiles,
    ModelInstance,
    ServerContext,
    cuda_driver_gpus,
)


class OnnxBackend(BaseBackend):
    """Serves ONNX models with ONNX Runtime, one InferenceSession per instance."""

    name: str = "onnxruntime"
    platforms: tuple[str, ...] = ("onnxruntime_onnx",)
    default_model_filename: str = "model.onnx"
    default_cpu_instance_count: int = 2  # as Triton's onnxruntime backend

    def usable_gpus(self) -> Sequence[int]:
        """The GPUs the CUDA driver shows, where this onnxruntime has the CUDA provider (the
        GPU build); none with the CPU build, so its models stay on the CPU."""
        import onnxruntime as ort

        if "CUDAExecutionProvider" not in ort.get_available_providers():
            return ()
        return cuda_driver_gpus()

    def complete_config(self, model: ModelFiles, config: ModelConfig, server: ServerContext) -> ModelConfig:
        from coreserve_onnx._loading import complete

        return complete(model, config, server)

    def load_instance(
        self, model: ModelFiles, config: ModelConfig, placement: InstancePlacement, server: ServerContext
    ) -> ModelInstance:
        from coreserve_onnx._loading import create_instance

        return create_instance(model, config, placement, server)
