"""coreserve on Ray Serve (`pip install 'core-server[ray]'`): one model repository, N replicas.

Each replica is an in-process `coreserve.Server`; Ray Serve's HTTP proxy spreads KServe v2
requests over them, restarts the ones whose health check fails, and scales their number.
`coreserve ray …` starts it; so does `serve run coreserve.ray:build_app model_repository=…`
or a Serve config file naming `coreserve.ray:build_app`.

Layer 8: may import the in-process API and the layers below it; nothing of the command line.
"""

from __future__ import annotations

from coreserve.ray._app import DEPLOYMENT_NAME, build_app, coreserve_app, deployment
from coreserve.ray._autoscaling import PENDING_REQUESTS, pending_requests_policy
from coreserve.ray._replica import REPLICA_HEADER, CoreserveReplica

__all__ = [
    "DEPLOYMENT_NAME",
    "PENDING_REQUESTS",
    "REPLICA_HEADER",
    "CoreserveReplica",
    "build_app",
    "coreserve_app",
    "deployment",
    "pending_requests_policy",
]
