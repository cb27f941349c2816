"""The `fil` backend: tree models in the repository layout of Triton's FIL backend, on the CPU.

The frameworks (XGBoost, LightGBM, Treelite) are imported when a model loads, not when the
plugin registers.
"""

from __future__ import annotations

from coreserve import ModelConfig
from coreserve.backend import BaseBackend, InstancePlacement, ModelFiles, ModelInstance, ServerContext


class FilBackend(BaseBackend):
    """Serves XGBoost, LightGBM and Treelite forests as Triton's FIL backend does.

    It has no default file name of its own: as in Triton's FIL, the file follows the
    `model_type` parameter (`xgboost.json`, `model.txt`, ...) unless the configuration's
    `default_model_filename` names one.
    """

    name: str = "fil"
    platforms: tuple[str, ...] = ()
    default_model_filename: str = ""

    def complete_config(self, model: ModelFiles, config: ModelConfig, server: ServerContext) -> ModelConfig:
        from coreserve_fil._instance import complete

        return complete(model, config, server)

    def load_instance(
        self, model: ModelFiles, config: ModelConfig, placement: InstancePlacement, server: ServerContext
    ) -> ModelInstance:
        from coreserve_fil._instance import create_instance

        return create_instance(model, config, placement)
