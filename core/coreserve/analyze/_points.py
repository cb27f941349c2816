"""What one sweep point is: the model's settings under test, and what a load measured on them.

`ModelSettings` is the part of a model configuration that `coreserve analyze` searches
(Model Analyzer's "model config" axes); `Measurement` is one load level on one settings, in
the units the report and Model Analyzer's CSV use (infer/s, milliseconds, percent, MB).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from coreserve.protos.model_config_pb2 import ModelConfig


@dataclass(frozen=True, order=True)
class ModelSettings:
    """The searched part of a model configuration."""

    max_batch_size: int
    dynamic_batching: bool
    instance_count: int
    max_queue_delay_us: int = 0

    @property
    def key(self) -> str:
        """A short stable name: the checkpoint and the output folders use it."""
        batching = f"db{self.max_queue_delay_us}" if self.dynamic_batching else "nodb"
        return f"mbs{self.max_batch_size}_{batching}_i{self.instance_count}"

    def describe(self) -> str:
        batching = "no dynamic batching"
        if self.dynamic_batching:
            batching = f"dynamic batching ({self.max_queue_delay_us} µs)"
        instances = "1 instance" if self.instance_count == 1 else f"{self.instance_count} instances"
        return f"max_batch_size={self.max_batch_size}, {batching}, {instances}"

    def applied_to(self, base: ModelConfig) -> ModelConfig:
        """`base` with these settings: every instance group gets the count (the kind stays), and
        dynamic batching keeps its other fields (preferred sizes up to the new batch size)."""
        config = ModelConfig()
        config.CopyFrom(base)
        config.max_batch_size = self.max_batch_size
        if self.dynamic_batching:
            batching = config.dynamic_batching
            batching.max_queue_delay_microseconds = self.max_queue_delay_us
            # Preferred sizes the new batch size still allows are kept; larger ones are refused.
            kept = [size for size in batching.preferred_batch_size if size <= self.max_batch_size]
            del batching.preferred_batch_size[:]
            batching.preferred_batch_size.extend(kept)
        else:
            config.ClearField("dynamic_batching")
        if not config.instance_group:
            config.instance_group.add()
        for group in config.instance_group:
            group.count = self.instance_count
        return config

    @classmethod
    def of(cls, config: ModelConfig) -> ModelSettings:
        """The settings `config` has now (the sweep's starting point and its baseline)."""
        counts = [group.count or 1 for group in config.instance_group]
        return cls(
            max_batch_size=config.max_batch_size,
            dynamic_batching=config.HasField("dynamic_batching"),
            instance_count=max(counts, default=1),
            max_queue_delay_us=config.dynamic_batching.max_queue_delay_microseconds,
        )


@dataclass
class Measurement:
    """One load level (client concurrency) on one settings, or why it could not be measured."""

    settings: ModelSettings
    concurrency: int
    throughput: float = 0.0  # inferences per second (a batch of 4 counts 4)
    p50_ms: float = 0.0
    p95_ms: float = 0.0
    p99_ms: float = 0.0
    avg_ms: float = 0.0
    # The server's split of a request's time, averaged from its statistics over the window.
    queue_ms: float = 0.0
    compute_input_ms: float = 0.0
    compute_infer_ms: float = 0.0
    compute_output_ms: float = 0.0
    server_cpu_percent: float = 0.0  # the server's process tree; 100 is one core
    server_rss_mb: float = 0.0
    client_cpu_percent: float = 0.0  # the load generator's own process
    requests: int = 0
    errors: int = 0
    error: str = ""  # set where the settings failed to load or every request failed
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return bool(self.error)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Measurement:
        values = dict(data)
        values["settings"] = ModelSettings(**values["settings"])
        return cls(**values)
