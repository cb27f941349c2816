"""The data plane: what both frontends do, written once.

HTTP and gRPC decode their messages into `InferenceRequest`s and call these methods; every
model-related decision (which version, is it ready, is the request valid) is made here.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from coreserve import __version__
from coreserve.config import ModelConfig
from coreserve.errors import CoreserveError, UnavailableError
from coreserve.repository import ModelRepository, ModelVersion
from coreserve.repository.model import parse_version
from coreserve.responses import SingleResponse
from coreserve.types import InferenceRequest, InferenceResponse

SERVER_NAME = "coreserve"
EXTENSIONS = ("binary_tensor_data", "model_configuration")


@dataclass
class ServerFlags:
    """The state the health endpoints report."""

    started: bool = False
    stopping: bool = False
    strict_readiness: bool = True


class DataPlane:
    """Health, metadata and inference over the model repository."""

    def __init__(self, repository: ModelRepository, flags: ServerFlags) -> None:
        self.repository = repository
        self.flags = flags

    def live(self) -> bool:
        return not self.flags.stopping

    def ready(self) -> bool:
        if not self.flags.started or self.flags.stopping:
            return False
        return self.repository.all_ready() if self.flags.strict_readiness else True

    def server_metadata(self) -> dict[str, Any]:
        return {"name": SERVER_NAME, "version": __version__, "extensions": list(EXTENSIONS)}

    def model_version(self, name: str, version: str = "") -> ModelVersion:
        """The ready model version a request names; raises NotFound or Unavailable."""
        return self.repository.get(name).version(version)

    def model_ready(self, name: str, version: str = "") -> bool:
        try:
            self.model_version(name, version)
        except CoreserveError:
            return False
        return True

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        model = self.repository.get(name)
        chosen = model.version(version)
        signature = chosen.signature
        return {
            "name": name,
            "versions": [str(v) for v in ([parse_version(version)] if version else model.ready_versions())],
            "platform": chosen.config.platform or chosen.config.backend,
            "inputs": [
                {"name": s.name, "datatype": s.datatype.value, "shape": signature.client_shape(s)}
                for s in signature.inputs.values()
            ],
            "outputs": [
                {"name": s.name, "datatype": s.datatype.value, "shape": signature.client_shape(s)}
                for s in signature.outputs.values()
            ],
        }

    def model_config(self, name: str, version: str = "") -> ModelConfig:
        model = self.repository.get(name)
        if version or model.config is None:
            return model.version(version).config
        return model.config

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        """Checks a request against the model, schedules it and waits for its response."""
        model_version = self.model_version(request.model_name, request.model_version)
        model_version.signature.check_request(request)
        scheduler = model_version.scheduler
        if scheduler is None:
            raise UnavailableError(f"model '{request.model_name}' is not ready")
        sink = SingleResponse(asyncio.get_running_loop())
        request.sink = sink
        scheduler.submit(request)
        return await sink.future
