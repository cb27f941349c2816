"""The `echo` backend: echoes each input as the output at the same position of the configuration.

An echo to start from (`coreserve new-backend` wrote it): replace what `load_instance` loads
and what `execute` computes with your format's, and keep the conformance tests passing.

It uses only coreserve's public API. Configuration parameters:

- `delay_ms`: each execution waits this long first (to observe scheduling); a request
  parameter `delay_ms` asks for a longer wait;
- request parameters are returned as response parameters (for batches of one request).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np

from coreserve import InferenceRequest, ModelConfig, ModelConfigError
from coreserve.backend import (
    BaseBackend,
    InstancePlacement,
    ModelFiles,
    Responder,
    ServerContext,
    run_batched,
)


class EchoInstance:
    """One loaded echo model: pairs each input with the output at its position."""

    def __init__(self, config: ModelConfig) -> None:
        self._pairs = [(i.name, o.name) for i, o in zip(config.input, config.output, strict=True)]
        entry = config.parameters.get("delay_ms")
        self._delay_s = float(entry.string_value) / 1000 if entry is not None else 0.0

    async def execute(self, requests: Sequence[InferenceRequest], responder: Responder) -> None:
        """Answers the batch: one request with parameters keeps them; otherwise one merged call."""
        asked = [float(request.parameters.get("delay_ms", 0)) / 1000 for request in requests]
        delay_s = max([self._delay_s, *asked])
        if delay_s:
            await asyncio.sleep(delay_s)
        if len(requests) == 1 and requests[0].parameters:
            request = requests[0]
            outputs = {o: request.inputs[i] for i, o in self._pairs if i in request.inputs}
            responder.send(request, outputs, parameters=request.parameters)
            return
        # Echoing is quicker than a thread hop: run_batched calls it inline (no thread=).
        await run_batched(requests, responder, self._echo)

    def _echo(self, inputs: dict[str, np.ndarray], output_names: Sequence[str]) -> dict[str, np.ndarray]:
        return {o: inputs[i] for i, o in self._pairs if o in output_names}

    async def close(self) -> None:
        """Nothing to release: the instance holds no threads, files or processes."""


class EchoBackend(BaseBackend):
    """Serves `model.echo` files (their content is not read): the configuration says it all."""

    name = "echo"
    platforms: tuple[str, ...] = ("echo_platform",)
    default_model_filename = "model.echo"

    def load_instance(
        self, model: ModelFiles, config: ModelConfig, placement: InstancePlacement, server: ServerContext
    ) -> EchoInstance:
        if len(config.input) != len(config.output):
            raise ModelConfigError(f"model '{model.name}': echo needs as many outputs as inputs")
        return EchoInstance(config)
