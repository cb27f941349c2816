"""The Ray Serve application: the deployment's defaults and the builder `serve run` calls."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ray import serve
from ray.serve import Application
from ray.serve.deployment import Deployment

from coreserve.ray._replica import CoreserveReplica

DEPLOYMENT_NAME = "coreserve"
# Requests a replica accepts at once. Ray's default (5) would keep requests in Ray's queues,
# where coreserve's dynamic batcher cannot group them; coreserve bounds its own queues.
MAX_ONGOING_REQUESTS = 256
HEALTH_CHECK_PERIOD_S = 10.0


def deployment(**options: Any) -> Deployment:
    """The coreserve deployment with coreserve's defaults; `options` are Ray Serve deployment options
    (`num_replicas`, `autoscaling_config`, `ray_actor_options` …) and win over the defaults."""
    defaults: dict[str, Any] = {
        "name": DEPLOYMENT_NAME,
        "max_ongoing_requests": MAX_ONGOING_REQUESTS,
        "health_check_period_s": HEALTH_CHECK_PERIOD_S,
    }
    replica: Deployment = serve.deployment(CoreserveReplica)  # type: ignore[assignment]  # Ray's overloads
    return replica.options(**{**defaults, **options})


def coreserve_app(
    model_repository: str | Sequence[str],
    settings: Mapping[str, Any] | None = None,
    **options: Any,
) -> Application:
    """The application to `serve.run`: the deployment bound to a repository and server settings."""
    return deployment(**options).bind(model_repository, dict(settings or {}))


def build_app(args: dict[str, Any]) -> Application:
    """The application builder for `serve run coreserve.ray:build_app model_repository=…`.

    `args`: `model_repository` (a location, or several separated by commas) and, from a config
    file, `settings` (a mapping of `coreserve.Server` keyword arguments). The deployment's
    own options (replicas, autoscaling) go in the config file's `deployments` section, under
    the name "coreserve".
    """
    repository = args.get("model_repository")
    if not repository:
        raise ValueError("coreserve.ray:build_app needs model_repository=LOCATION[,LOCATION…]")
    locations = repository.split(",") if isinstance(repository, str) else list(repository)
    return coreserve_app(locations, args.get("settings") or {})
