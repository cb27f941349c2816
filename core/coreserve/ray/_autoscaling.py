"""Ray Serve autoscaling on coreserve's pending-request count (queued + executing, every model)."""

from __future__ import annotations

from typing import Any

# The custom metric each replica reports (CoreserveReplica.record_autoscaling_stats).
PENDING_REQUESTS = "coreserve_pending_requests"


def pending_requests_policy(ctx: Any) -> tuple[float, dict[str, Any]]:
    """Replicas wanted: the pending requests of all replicas over `target_ongoing_requests` each.

    Use it as `autoscaling_config.policy.policy_function: coreserve.ray:pending_requests_policy`;
    Ray applies the config's min/max replicas, up/downscale delays and factors around it.
    `ctx` is Ray Serve's AutoscalingContext. Until the replicas have reported (or when none
    runs), it keeps Ray's current target.
    """
    reported = (ctx.aggregated_metrics or {}).get(PENDING_REQUESTS, {})
    if ctx.current_num_replicas == 0 or not reported:
        return ctx.target_num_replicas, {}
    pending = sum(reported.values())
    return pending / ctx.config.get_target_ongoing_requests(), {}
