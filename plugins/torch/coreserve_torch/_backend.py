"""The `pytorch` backend: TorchScript and torch.export models, one module per instance.

torch is imported when a model loads, not when the plugin registers: `loading` (which imports
torch) is imported inside the methods that need it.
"""

from __future__ import annotations

from collections.abc import Sequence

from coreserve import ModelConfig
from coreserve.backend import BaseBackend, InstancePlacement, ModelFiles, ModelInstance, ServerContext
from coreserve_torch._formats import is_export


class TorchBackend(BaseBackend):
    """Serves TorchScript (`model.pt`) and torch.export (`model.pt2`) models."""

    name: str = "pytorch"
    platforms: tuple[str, ...] = ("pytorch_libtorch",)
    default_model_filename: str = "model.pt"

    def usable_gpus(self) -> Sequence[int]:
        """The GPUs torch sees (none with the CPU build of torch)."""
        import torch

        return range(torch.cuda.device_count()) if torch.cuda.is_available() else ()

    def complete_config(self, model: ModelFiles, config: ModelConfig, server: ServerContext) -> ModelConfig:
        """Completes configurations of torch.export programs; TorchScript files carry no shapes."""
        if not is_export(model.filename):
            return config
        from coreserve_torch._loading import complete_from_export

        return complete_from_export(model, config, server)

    def load_instance(
        self, model: ModelFiles, config: ModelConfig, placement: InstancePlacement, server: ServerContext
    ) -> ModelInstance:
        from coreserve_torch._loading import create_instance

        return create_instance(model, config, placement, server)
