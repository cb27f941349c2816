"""What every output of an analysis says the same way: the constraints in words, the instance
group as Model Analyzer writes it, and the recommended configurations with their change from
the model's current one (the terminal table and the report show the same rows)."""

from __future__ import annotations

from dataclasses import dataclass

from coreserve.analyze._analysis import Analysis
from coreserve.analyze._points import GPU, Measurement, ModelSettings, with_instance_count
from coreserve.analyze._ranking import Constraints
from coreserve.protos.model_config_pb2 import ModelConfig, ModelInstanceGroup

# The load generator's own CPU (100 is one core) from which the client, not the server, may
# have set the pace: a Python client busy on one core cannot send faster.
CLIENT_BOUND_PERCENT = 85.0


def describe_constraints(constraints: Constraints) -> str:
    """The constraints in words, as the table and the report head them."""
    parts = []
    if constraints.latency_budget_ms is not None:
        parts.append(f"p99 latency ≤ {constraints.latency_budget_ms:g} ms")
    if constraints.min_throughput is not None:
        parts.append(f"throughput ≥ {constraints.min_throughput:g} infer/s")
    if constraints.max_memory_mb is not None:
        parts.append(f"server memory ≤ {constraints.max_memory_mb:g} MB")
    if constraints.max_gpu_memory_mb is not None:
        parts.append(f"GPU memory ≤ {constraints.max_gpu_memory_mb:g} MB")
    return ", ".join(parts) or "none"


def config_path_name(model: str, settings: ModelSettings) -> str:
    """The name Model Analyzer's "Model Config Path" column gives a configuration."""
    return f"{model}_config_{settings.key}"


def instance_group_label(config: ModelConfig) -> str:
    """Model Analyzer's "Instance Group" text: count per kind, "2:CPU" or "1:GPU + 2:CPU"."""
    counts: dict[str, int] = {}
    for group in config.instance_group:
        kind = _kind_name(group.kind)
        count = group.count or 1
        counts[kind] = counts.get(kind, 0) + count * max(1, len(group.gpus))
    return " + ".join(f"{count}:{kind}" for kind, count in counts.items()) or "1:CPU"


def instances_text(analysis: Analysis, settings: ModelSettings) -> str:
    """The "Instance Group" of `settings`: the model's own, then each composing model's by name."""
    parts = []
    if settings.own_settings:
        parts.append(instance_group_label(settings.applied_to(analysis.base_config)))
    for name, count in settings.composing:
        config = with_instance_count(analysis.composing_configs[name], count)
        parts.append(f"{name} {instance_group_label(config)}")
    return ", ".join(parts)


def instance_counts_text(settings: ModelSettings) -> str:
    """The instance counts in a table cell: "2", or "2; preprocess 1, classifier 3"."""
    on_gpu = " GPU" if settings.instance_kind == GPU else ""
    own = [f"{settings.instance_count}{on_gpu}"] if settings.own_settings else []
    composing = ", ".join(f"{name} {count}" for name, count in settings.composing)
    return "; ".join([*own, composing] if composing else own)


def _kind_name(kind: ModelInstanceGroup.Kind) -> str:
    if kind == ModelInstanceGroup.KIND_AUTO:  # what Model Analyzer writes for a group without kind
        return "CPU"
    return ModelInstanceGroup.Kind.Name(kind).removeprefix("KIND_")


def whole(value: float | None) -> str:
    """A figure rounded to a whole number, or "-" where it was not measured."""
    return "-" if value is None else f"{value:.0f}"


def usage_headers(analysis: Analysis) -> list[str]:
    """The tables' columns of what the server used: its CPU and memory, and its GPUs' where it
    reported any."""
    headers = ["server CPU %", "RSS MB"]
    return [*headers, "GPU %", "GPU MB"] if analysis.measured_gpus else headers


def usage_cells(analysis: Analysis, point: Measurement) -> list[str]:
    cells = [whole(point.server_cpu_percent), whole(point.server_rss_mb)]
    if analysis.measured_gpus:
        cells += [whole(point.gpu_utilization_percent), whole(point.gpu_memory_mb)]
    return cells


def dynamic_batching_label(settings: ModelSettings) -> str:
    return f"{settings.max_queue_delay_us} µs" if settings.dynamic_batching else "off"


def client_bound_note(point: Measurement) -> str:
    """A sentence where the load generator was the bottleneck at `point`, else ""."""
    if point.client_cpu_percent < CLIENT_BOUND_PERCENT:
        return ""
    return (
        f"The load generator used {point.client_cpu_percent:.0f}% of a core at concurrency "
        f"{point.concurrency}: the client, not the server, may have been the bottleneck; the "
        "server may do better than measured (try perf_analyzer or a client on another machine)."
    )


@dataclass(frozen=True)
class Recommendation:
    """One row of the best configurations: its best passing point and its change from the
    current configuration ("baseline" on the current one, "n/a" where that has no passing point)."""

    rank: int
    point: Measurement
    throughput_change: str
    p99_change: str

    @property
    def is_baseline(self) -> bool:
        return self.throughput_change == "baseline"


def recommendations(analysis: Analysis, top: int) -> list[Recommendation]:
    """The `top` settings that meet the constraints, best first."""
    baseline = analysis.baseline_best()
    rows = []
    for rank, point in enumerate(analysis.ranking().passing[:top], start=1):
        if baseline is None:
            changes = ("n/a", "n/a")
        elif point.settings == analysis.baseline:
            changes = ("baseline", "baseline")
        else:
            changes = (_change(point.throughput, baseline.throughput), _change(point.p99_ms, baseline.p99_ms))
        rows.append(Recommendation(rank, point, *changes))
    return rows


def _change(value: float, base: float) -> str:
    if base <= 0:
        return "n/a"
    return f"{(value - base) / base * 100:+.0f}%"


def violations_text(analysis: Analysis, point: Measurement) -> str:
    return "; ".join(analysis.constraints.violations(point))
