"""The built-in `ensemble` platform, registered through the same hook as any plugin."""

from __future__ import annotations

import logging

from coreserve.backend.api import InstancePlacement, ModelFiles, ModelInstance, ServerContext
from coreserve.backend.plugins.hookspecs import hookimpl
from coreserve.backend.plugins.registry import BackendRegistry
from coreserve.config.signature import ModelSignature
from coreserve.ensemble._graph import EnsembleGraph
from coreserve.ensemble._instance import EnsembleInstance
from coreserve.errors import ModelConfigError, UnavailableError
from coreserve.protos.model_config_pb2 import ModelConfig

logger = logging.getLogger(__name__)


class EnsembleBackend:
    """Pipelines of other models (`platform: "ensemble"`, `ensemble_scheduling { step [...] }`)."""

    name: str = "ensemble"
    platforms: tuple[str, ...] = ("ensemble",)
    default_model_filename: str = ""

    def auto_complete_config(
        self, model: ModelFiles, config: ModelConfig, server: ServerContext
    ) -> ModelConfig:
        return config

    async def create_instance(
        self, model: ModelFiles, config: ModelConfig, placement: InstancePlacement, server: ServerContext
    ) -> ModelInstance:
        if not config.HasField("ensemble_scheduling"):
            raise ModelConfigError(f"model '{config.name}': platform 'ensemble' needs ensemble_scheduling")
        if server.client is None:
            raise UnavailableError(f"ensemble '{config.name}' needs the server's in-process client")
        signature = ModelSignature(config)
        graph = EnsembleGraph(config)
        graph.validate(server.client.model_signature, signature)
        limit = config.ensemble_scheduling.max_inflight_requests
        if limit > 0:  # (Triton's words, which its QA looks for)
            logger.info("Ensemble model '%s' configured with max_inflight_requests: %d", config.name, limit)
        return EnsembleInstance(graph, server.client, signature.decoupled, limit)


@hookimpl
def coreserve_register_backends(register: BackendRegistry) -> None:
    register.add(EnsembleBackend())
