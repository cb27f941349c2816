"""coreserve's traffic families: each model's weights by version, what its shadow copies found,
and where its rollout stands.

Exported only for models that have a traffic policy, shadow copies or a rollout (Triton has no
such families; a server without them scrapes as before), and only while a model of that name
is served: as Triton's per-model series do, a model's traffic series leave when it unloads (a
rollout that a reload ended stays, as ended). Triton's per-version families keep counting each
version exactly: a shadow copy is a request of its version there.
"""

from __future__ import annotations

from coreserve.errors import CoreserveError
from coreserve.repository import ModelRepository
from coreserve.server.metrics._lifecycle import _escape
from coreserve.server.metrics._system_metrics import family
from coreserve.server.traffic import TrafficRouter

# What the comparisons of each output of the shadow copies found: name, type, HELP, field.
OUTPUT_FAMILIES = (
    ("coreserve_traffic_shadow_output_comparisons_total", "counter",
     "Outputs of a shadow copy compared with the client's answer (coreserve)", "compared"),
    ("coreserve_traffic_shadow_output_mismatches_total", "counter",
     "Outputs of a shadow copy that differ from the client's answer (coreserve)", "mismatched"),
    ("coreserve_traffic_shadow_output_max_abs_diff", "gauge",
     "Largest absolute difference between a shadow copy's numeric output and the client's (coreserve)",
     "max_abs_diff"),
)  # fmt: skip
# The rollout states as the state gauge's values.
ROLLOUT_STATES = {"RUNNING": 1, "PROMOTED": 2, "ROLLED_BACK": 3, "ABORTED": 4}


def render_traffic_metrics(repository: ModelRepository, router: TrafficRouter | None) -> str:
    """The traffic families in Prometheus text format 0.0.4 (none while no model has any)."""
    lines = _traffic_lines(repository, router) if router is not None else []
    return "".join(line + "\n" for line in lines)


def _traffic_lines(repository: ModelRepository, router: TrafficRouter) -> list[str]:
    weights = [
        f'coreserve_traffic_weight{{model="{_escape(model.name)}",version="{version}"}} {weight:g}'
        for model in repository.models()
        if model.traffic is not None
        for version, weight in model.traffic.weights
    ]
    lines = []
    if weights:
        lines += family(
            "coreserve_traffic_weight",
            "gauge",
            "Percent of the requests that name no version that go to each version (coreserve)",
            weights,
        )
    shadows = {key: counts for key, counts in router.shadows.counts.items() if _served(repository, key[0])}
    if shadows:
        lines += family(
            "coreserve_traffic_shadow_requests_total",
            "counter",
            "Shadow copies of requests sent to a candidate version, by outcome (coreserve)",
            (
                f'coreserve_traffic_shadow_requests_total{{model="{_escape(name)}",version="{version}",'
                f'outcome="{outcome}"}} {getattr(counts, outcome)}'
                for (name, version), counts in shadows.items()
                for outcome in ("compared", "shed", "failed")
            ),
        )
        outputs = [
            (f'model="{_escape(name)}",version="{version}",output="{_escape(output)}"', comparison)
            for (name, version), counts in shadows.items()
            for output, comparison in counts.outputs.items()
        ]
        for name, kind, help_text, field in OUTPUT_FAMILIES:
            lines += family(
                name,
                kind,
                help_text,
                (f"{name}{{{labels}}} {getattr(c, field):.9g}" for labels, c in outputs),
            )
    rollouts = {name: r for name, r in router.rollouts.items() if _served(repository, name)}
    if rollouts:
        lines += family(
            "coreserve_traffic_rollout_state",
            "gauge",
            "A model's rollout: 1 running, 2 promoted, 3 rolled back, 4 aborted (coreserve)",
            (
                f'coreserve_traffic_rollout_state{{model="{_escape(name)}",candidate="{r.plan.candidate}",'
                f'stable="{r.stable}"}} {ROLLOUT_STATES[r.state.value]}'
                for name, r in rollouts.items()
            ),
        )
        lines += family(
            "coreserve_traffic_rollout_step",
            "gauge",
            "The step a model's rollout is at, from 0 (coreserve)",
            (
                f'coreserve_traffic_rollout_step{{model="{_escape(name)}"}} {r.step}'
                for name, r in rollouts.items()
            ),
        )
    return lines


def _served(repository: ModelRepository, name: str) -> bool:
    """Whether a request for `name` reaches a model now (not unloaded, nor never loaded)."""
    try:
        repository.get(name)
    except CoreserveError:
        return False
    return True
