"""Schedulers: per-model queues that form batches and feed a pool of instances.

Layer 3: may import the backend API and the layers below it; never the repository or the server.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from coreserve.backend.api import ModelInstance
from coreserve.config.signature import ModelSignature
from coreserve.protos.model_config_pb2 import ModelConfig
from coreserve.scheduling._dynamic import DynamicBatcher
from coreserve.scheduling._execution import close_instances, execute_batch
from coreserve.scheduling._scheduler import Scheduler, stop_refusal
from coreserve.scheduling.sequence._batcher import SequenceBatcher
from coreserve.scheduling.statistics import LatencyOptions, ModelStatistics

__all__ = [
    "DynamicBatcher",
    "LatencyOptions",
    "ModelStatistics",
    "Scheduler",
    "SequenceBatcher",
    "close_instances",
    "execute_batch",
    "make_scheduler",
    "stop_refusal",
]


def make_scheduler(
    config: ModelConfig,
    signature: ModelSignature,
    statistics: ModelStatistics,
    instances: Sequence[ModelInstance],
    model_path: Path | None = None,
) -> Scheduler:
    """The scheduler a model configuration asks for."""
    decoupled = config.model_transaction_policy.decoupled
    if config.HasField("sequence_batching"):
        return SequenceBatcher(
            signature, statistics, instances, config.sequence_batching, model_path, decoupled=decoupled
        )
    if config.HasField("dynamic_batching"):
        return DynamicBatcher(signature, statistics, instances, config.dynamic_batching, decoupled=decoupled)
    return Scheduler(signature, statistics, instances, decoupled=decoupled)
