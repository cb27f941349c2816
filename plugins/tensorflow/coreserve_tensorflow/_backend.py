"""The `tensorflow` backend: SavedModels (`model.savedmodel/`) and frozen GraphDefs (`model.graphdef`).

TensorFlow is imported when a model loads, never when the plugin registers.
"""

from __future__ import annotations

from collections.abc import Sequence

from coreserve import ModelConfig, ModelConfigError
from coreserve.backend import BaseBackend, InstancePlacement, ModelFiles, ModelInstance, ServerContext
from coreserve_tensorflow._layout import model_path, platform_of


class TensorFlowBackend(BaseBackend):
    """Serves TensorFlow models as Triton's TensorFlow backend does, on the devices TensorFlow sees.

    The default file name is the SavedModel's; a GraphDef (`platform: "tensorflow_graphdef"`,
    or only a `model.graphdef` in the version) is read from `model.graphdef`.
    """

    name: str = "tensorflow"
    platforms: tuple[str, ...] = ("tensorflow_savedmodel", "tensorflow_graphdef")
    default_model_filename: str = "model.savedmodel"
    default_cpu_instance_count: int = 2  # as Triton's tensorflow backend

    def usable_gpus(self) -> Sequence[int]:
        """The GPUs TensorFlow sees: none with the CPU build (tensorflow-cpu)."""
        from coreserve_tensorflow._runtime import visible_gpus

        return visible_gpus()

    def auto_complete_config(
        self, model: ModelFiles, config: ModelConfig, server: ServerContext
    ) -> ModelConfig:
        """Sets the platform from the files when the configuration has none, then completes
        inputs and outputs from a SavedModel's signature where they are missing."""
        config.platform = platform_of(model, config)
        return super().auto_complete_config(model, config, server)

    def complete_config(self, model: ModelFiles, config: ModelConfig, server: ServerContext) -> ModelConfig:
        from coreserve_tensorflow._instance import complete

        return complete(model, config, server)

    def load_instance(
        self, model: ModelFiles, config: ModelConfig, placement: InstancePlacement, server: ServerContext
    ) -> ModelInstance:
        from coreserve_tensorflow._instance import create_instance

        return create_instance(model, config, placement)

    def check_model_file(self, model: ModelFiles) -> None:
        """Raises the ModelConfigError naming a missing SavedModel folder or GraphDef file.

        :param model: the model version (its configuration's platform is not known here, so
            either format's default name will do).
        """
        for platform in self.platforms:
            config = ModelConfig(platform=platform)
            if model_path(model, config).exists():
                return
        raise ModelConfigError(
            f"model '{model.name}': model file {model.model_file} not found (a SavedModel folder "
            "model.savedmodel or a GraphDef file model.graphdef)"
        )
