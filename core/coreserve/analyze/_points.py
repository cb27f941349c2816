"""What one sweep point is: the model's settings under test, and what a load measured on them.

`ModelSettings` is the part of a model configuration that `coreserve analyze` searches
(Model Analyzer's "model config" axes), with the instance counts of the models it is composed
of (an ensemble's steps, or the models a BLS model calls); `Measurement` is one load level on
one settings, in the units the report and Model Analyzer's CSV use (infer/s, ms, %, MB).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from coreserve.protos.model_config_pb2 import ModelConfig, ModelInstanceGroup

CLIENT_BATCH_SIZE = 1  # inferences per request the load generator sends (the CSV's "Batch")
CPU, GPU = "KIND_CPU", "KIND_GPU"


@dataclass(frozen=True, order=True)
class ModelSettings:
    """The searched part of a model configuration, and of the models it is composed of."""

    max_batch_size: int
    dynamic_batching: bool
    instance_count: int
    max_queue_delay_us: int = 0
    # (model, instance count) of each composing model, in the order the model names them.
    composing: tuple[tuple[str, int], ...] = ()
    # False for an ensemble: it has no instances or batcher of its own, only its steps'.
    own_settings: bool = True
    # KIND_CPU or KIND_GPU given to every instance group; "" keeps each group's kind.
    instance_kind: str = ""

    @property
    def key(self) -> str:
        """A short stable name: the checkpoint and the output folders use it."""
        parts = []
        if self.own_settings:
            batching = f"db{self.max_queue_delay_us}" if self.dynamic_batching else "nodb"
            on_gpu = "_gpu" if self.instance_kind == GPU else ""
            parts.append(f"mbs{self.max_batch_size}_{batching}_i{self.instance_count}{on_gpu}")
        parts.extend(f"{name}-i{count}" for name, count in self.composing)
        return "_".join(parts)

    def describe(self) -> str:
        parts = []
        if self.own_settings:
            batching = "no dynamic batching"
            if self.dynamic_batching:
                batching = f"dynamic batching ({self.max_queue_delay_us} µs)"
            instances = _instances(self.instance_count) + (" on GPU" if self.instance_kind == GPU else "")
            parts += [f"max_batch_size={self.max_batch_size}", batching, instances]
        parts.extend(f"{name}: {_instances(count)}" for name, count in self.composing)
        return ", ".join(parts)

    def applied_to(self, base: ModelConfig) -> ModelConfig:
        """`base` with these settings: every instance group gets the count (and the kind, where
        one is set), and dynamic batching keeps its other fields (preferred sizes up to the new
        batch size).
        An ensemble's (not `own_settings`) is `base` as it is."""
        if not self.own_settings:
            return base
        config = ModelConfig()
        config.CopyFrom(base)
        config.max_batch_size = self.max_batch_size
        if self.dynamic_batching:
            batching = config.dynamic_batching
            batching.max_queue_delay_microseconds = self.max_queue_delay_us
            # Preferred sizes the new batch size still allows are kept; larger ones are refused.
            # The one the server fills in (the base's max batch size) is its default, not a
            # choice: the candidate's load fills in its own.
            sizes = list(batching.preferred_batch_size)
            if sizes == [base.max_batch_size]:
                sizes = []
            kept = [size for size in sizes if size <= self.max_batch_size]
            del batching.preferred_batch_size[:]
            batching.preferred_batch_size.extend(kept)
        else:
            config.ClearField("dynamic_batching")
        config = with_instance_count(config, self.instance_count)
        if self.instance_kind:
            on_gpu = self.instance_kind == GPU
            for group in config.instance_group:
                group.kind = ModelInstanceGroup.KIND_GPU if on_gpu else ModelInstanceGroup.KIND_CPU
                if not on_gpu:
                    del group.gpus[:]
        return config

    @classmethod
    def of(cls, config: ModelConfig, composing: dict[str, ModelConfig] | None = None) -> ModelSettings:
        """The settings `config` (and its composing models' configurations) have now: the
        sweep's starting point and its baseline."""
        return cls(
            max_batch_size=config.max_batch_size,
            dynamic_batching=config.HasField("dynamic_batching"),
            instance_count=instance_count(config),
            max_queue_delay_us=config.dynamic_batching.max_queue_delay_microseconds,
            composing=tuple((name, instance_count(part)) for name, part in (composing or {}).items()),
            own_settings=config.platform != "ensemble",
            instance_kind=instance_kind(config),
        )

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelSettings:
        values = dict(data)
        values["composing"] = tuple((name, count) for name, count in values.get("composing", ()))
        return cls(**values)


def instance_count(config: ModelConfig) -> int:
    """A model's instance count as the sweep changes it: the largest of its groups' counts."""
    return max((group.count or 1 for group in config.instance_group), default=1)


def instance_kind(config: ModelConfig) -> str:
    """KIND_CPU or KIND_GPU where every instance group has that kind; else "" (the sweep then
    keeps each group's kind)."""
    kinds = {ModelInstanceGroup.Kind.Name(group.kind) for group in config.instance_group}
    return kinds.pop() if len(kinds) == 1 and kinds <= {CPU, GPU} else ""


def with_instance_count(config: ModelConfig, count: int) -> ModelConfig:
    """`config` with every instance group given `count` (a composing model's one setting)."""
    changed = ModelConfig()
    changed.CopyFrom(config)
    if not changed.instance_group:
        changed.instance_group.add()
    for group in changed.instance_group:
        group.count = count
    return changed


def _instances(count: int) -> str:
    return "1 instance" if count == 1 else f"{count} instances"


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
    # The server's process tree (100 is one core); None where the server is not ours to watch.
    server_cpu_percent: float | None = None
    server_rss_mb: float | None = None
    # The GPUs' (server metrics' nv_gpu_*): None where the server reports no GPU.
    gpu_utilization_percent: float | None = None
    gpu_memory_mb: float | None = None
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
        values["settings"] = ModelSettings.from_json(values["settings"])
        return cls(**values)
