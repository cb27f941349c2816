"""The Ray Serve application: the deployment's defaults and the builder `serve run` calls."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ray import serve
from ray.serve import Application
from ray.serve.deployment import Deployment

from coreserve.ray._multiplex import CoreserveIngress, multiplexed_replica_class
from coreserve.ray._replica import CoreserveReplica

DEPLOYMENT_NAME = "coreserve"
INGRESS_NAME = "coreserve-ingress"  # only with models_per_replica
# Requests a replica accepts at once. Ray's default (5) would keep requests in Ray's queues,
# where coreserve's dynamic batcher cannot group them; coreserve bounds its own queues.
MAX_ONGOING_REQUESTS = 256
HEALTH_CHECK_PERIOD_S = 10.0


def deployment(models_per_replica: int = 0, **options: Any) -> Deployment:
    """The coreserve deployment with coreserve's defaults; `options` are Ray Serve deployment options
    (`num_replicas`, `autoscaling_config`, `ray_actor_options` …) and win over the defaults.

    `models_per_replica` > 0: replicas of many-model repositories (see coreserve.ray._multiplex).
    """
    defaults: dict[str, Any] = {
        "name": DEPLOYMENT_NAME,
        "max_ongoing_requests": MAX_ONGOING_REQUESTS,
        "health_check_period_s": HEALTH_CHECK_PERIOD_S,
    }
    kind = multiplexed_replica_class(models_per_replica) if models_per_replica > 0 else CoreserveReplica
    replica: Deployment = serve.deployment(kind)  # type: ignore[assignment]  # Ray's overloads
    return replica.options(**{**defaults, **options})


def coreserve_app(
    model_repository: str | Sequence[str],
    settings: Mapping[str, Any] | None = None,
    models_per_replica: int = 0,
    **options: Any,
) -> Application:
    """The application to `serve.run`: the deployment bound to a repository and server settings.

    With `models_per_replica` > 0, an ingress deployment routes each request to a replica that
    holds its model (Ray Serve's model multiplexing); each replica holds at most that many.
    """
    replicas = deployment(models_per_replica, **options).bind(model_repository, dict(settings or {}))
    if models_per_replica <= 0:
        return replicas
    ingress: Deployment = serve.deployment(CoreserveIngress)  # type: ignore[assignment]
    return ingress.options(
        name=INGRESS_NAME, max_ongoing_requests=MAX_ONGOING_REQUESTS, ray_actor_options={"num_cpus": 0}
    ).bind(replicas)


def build_app(args: dict[str, Any]) -> Application:
    """The application builder for `serve run coreserve.ray:build_app model_repository=…`.

    `args`: `model_repository` (a location, or several separated by commas), optionally
    `models_per_replica` (many-model repositories) and, from a config file, `settings` (a
    mapping of `coreserve.Server` keyword arguments). The deployment's
    own options (replicas, autoscaling) go in the config file's `deployments` section, under
    the name "coreserve".
    """
    repository = args.get("model_repository")
    if not repository:
        raise ValueError("coreserve.ray:build_app needs model_repository=LOCATION[,LOCATION…]")
    locations = repository.split(",") if isinstance(repository, str) else list(repository)
    return coreserve_app(locations, args.get("settings") or {}, int(args.get("models_per_replica") or 0))
