"""`BaseBackend`: the defaults every backend shares, so that a backend states only what is its own."""

from __future__ import annotations

import asyncio

from coreserve.backend.api import InstancePlacement, ModelFiles, ModelInstance, ServerContext
from coreserve.errors import ModelConfigError
from coreserve.protos.model_config_pb2 import ModelConfig


class BaseBackend:
    """A backend with the usual defaults; subclass it and set what is yours.

    A subclass sets `name` (the configuration's `backend` field), `default_model_filename`
    and, where Triton has platform names for its format, `platforms`; then it overrides:

    - `load_instance` (blocking; runs on a worker thread) or, for a backend that must await
      while it loads (starting a worker process), `create_instance` itself;
    - `complete_config`, when the model file tells inputs and outputs (optional).

    The defaults: a configuration that already lists inputs and outputs is not completed
    again; a missing model file is reported, before completing or loading, as
    `ModelConfigError("model 'NAME': model file PATH not found")`.

    Example::

        class MyBackend(BaseBackend):
            name = "mybackend"
            default_model_filename = "model.my"

            def load_instance(self, model, config, placement, server):
                return MyInstance(model.model_file, config)
    """

    name: str = ""
    platforms: tuple[str, ...] = ()
    default_model_filename: str = ""

    def auto_complete_config(
        self, model: ModelFiles, config: ModelConfig, server: ServerContext
    ) -> ModelConfig:
        """Completes `config` with `complete_config` unless it lists inputs and outputs already;
        a missing model file is reported first. Runs on a worker thread.

        :param model: where the model version lies (`model.model_file` is the file to read).
        :param config: the configuration as the repository gave it.
        :param server: the server's context (`backend_config`, `logger`, ...).
        :return: the completed configuration.
        """
        if config.input and config.output:
            return config
        self.check_model_file(model)
        return self.complete_config(model, config, server)

    def complete_config(self, model: ModelFiles, config: ModelConfig, server: ServerContext) -> ModelConfig:
        """Fills inputs, outputs and `max_batch_size` from the model file (see
        `coreserve.backend.complete_config`); by default returns `config` unchanged.

        :param model: the model version; its file exists.
        :param config: the configuration, missing inputs or outputs.
        :param server: the server's context.
        :return: the completed configuration.
        """
        return config

    async def create_instance(
        self, model: ModelFiles, config: ModelConfig, placement: InstancePlacement, server: ServerContext
    ) -> ModelInstance:
        """Checks that the model file exists, then runs `load_instance` on a worker thread.

        :param model: the model version to load.
        :param config: the completed, validated configuration.
        :param placement: which instance of which `instance_group` entry (kind, device).
        :param server: the server's context.
        :return: the loaded instance.
        """
        self.check_model_file(model)
        return await asyncio.to_thread(self.load_instance, model, config, placement, server)

    def load_instance(
        self, model: ModelFiles, config: ModelConfig, placement: InstancePlacement, server: ServerContext
    ) -> ModelInstance:
        """Loads one instance (blocking: it runs on a worker thread). Override it, or
        `create_instance`; raise a `CoreserveError` whose message says why it cannot load.

        :param model: the model version to load; its file exists.
        :param config: the completed, validated configuration.
        :param placement: which instance of which `instance_group` entry (kind, device).
        :param server: the server's context.
        :return: the loaded instance.
        """
        raise NotImplementedError(
            f"{type(self).__name__} must override load_instance (blocking, run on a worker thread) "
            "or create_instance (async)"
        )

    def check_model_file(self, model: ModelFiles) -> None:
        """Raises the `ModelConfigError` that names a missing model file.

        :param model: the model version whose `model_file` must exist.
        """
        if not model.model_file.exists():
            raise ModelConfigError(f"model '{model.name}': model file {model.model_file} not found")
