"""coreserve's model lifecycle families: loads by reason, evictions under the memory budget,
each loaded model's measured memory, and how long requests waited for loads on demand.

Exported only by a server that loads models on demand or under a memory budget (Triton has
no such families; a server without those flags scrapes as before).
"""

from __future__ import annotations

import math

from coreserve.repository import ModelRepository
from coreserve.repository.memory.demand import WAIT_BUCKETS_S
from coreserve.server.metrics._system_metrics import family


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_lifecycle_metrics(repository: ModelRepository) -> list[str]:
    """The lifecycle families in Prometheus text format 0.0.4 (none unless the server asks)."""
    budgeted = repository.budgeted
    if not budgeted.on_demand and not budgeted.has_budget:
        return []
    counts = budgeted.lifecycle
    lines = family(
        "coreserve_model_loads_total",
        "counter",
        "Number of model loads that made a model ready, by what asked for them (coreserve)",
        (f'coreserve_model_loads_total{{reason="{reason}"}} {n}' for reason, n in counts.loads.items()),
    )
    lines += family(
        "coreserve_model_evictions_total",
        "counter",
        "Number of models unloaded to make room within the model memory budget (coreserve)",
        [f"coreserve_model_evictions_total {counts.evictions}"],
    )
    models = {model.name if not model.namespace else f"{model.namespace}::{model.name}": model
              for model in repository.models()}  # fmt: skip
    lines += family(
        "coreserve_model_memory_bytes",
        "gauge",
        "Host memory a loaded model took when it loaded, in bytes (coreserve)",
        (
            f'coreserve_model_memory_bytes{{model="{_escape(name)}"}} {model.memory_bytes}'
            for name, model in models.items()
            if model.memory_bytes is not None and model.takes_requests
        ),
    )
    if budgeted.memory.budget is not None:
        lines += family(
            "coreserve_model_memory_budget_bytes",
            "gauge",
            "The model memory budget (--model-memory-budget), in bytes (coreserve)",
            [f"coreserve_model_memory_budget_bytes {budgeted.memory.budget}"],
        )
    if budgeted.gpu_memory:
        lines += family(
            "coreserve_model_gpu_memory_bytes",
            "gauge",
            "GPU memory a loaded model took when it loaded, in bytes, on each GPU with a budget (coreserve)",
            (
                f'coreserve_model_gpu_memory_bytes{{model="{_escape(name)}",gpu="{gpu}"}} {size}'
                for name, model in models.items()
                if model.takes_requests
                for gpu, size in model.gpu_memory_bytes.items()
            ),
        )
        lines += family(
            "coreserve_model_gpu_memory_budget_bytes",
            "gauge",
            "Each GPU's model memory budget (--model-memory-budget gpu:<id>=BYTES), in bytes (coreserve)",
            (
                f'coreserve_model_gpu_memory_budget_bytes{{gpu="{gpu}"}} {memory.budget}'
                for gpu, memory in budgeted.gpu_memory.items()
            ),
        )
    running = 0
    buckets = []
    for bound, count in zip([*WAIT_BUCKETS_S, math.inf], counts.wait_buckets, strict=True):
        running += count
        le = "+Inf" if bound == math.inf else f"{bound:g}"
        buckets.append(f'coreserve_model_load_wait_seconds_bucket{{le="{le}"}} {running}')
    lines += family(
        "coreserve_model_load_wait_seconds",
        "histogram",
        "Time requests waited for a model to load on demand, in seconds (coreserve)",
        [
            *buckets,
            f"coreserve_model_load_wait_seconds_count {running}",
            f"coreserve_model_load_wait_seconds_sum {counts.wait_sum_s:.9g}",
        ],
    )
    return lines
