"""`coreserve ray …`: serves a model repository from Ray Serve replicas (the `ray` extra)."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import threading
from collections.abc import Sequence
from typing import Any

from coreserve.cli._flags import parse_serve_args
from coreserve.cli._options import server_options
from coreserve.ray import DEPLOYMENT_NAME, coreserve_app

logger = logging.getLogger("coreserve.ray")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="coreserve ray",
        description="Serve a model repository from Ray Serve replicas, each an in-process coreserve "
        "server, behind Ray Serve's HTTP proxy (KServe v2, as `coreserve`'s HTTP frontend). "
        "Every other flag is a `coreserve` flag for the replicas (--model-repository, "
        "--model-control-mode, --load-model …); their own HTTP, gRPC and metrics ports stay closed.",
    )
    parser.add_argument(
        "--address", default=None, help="the Ray cluster to join (default: $RAY_ADDRESS, or a new local one)"
    )
    parser.add_argument(
        "--num-replicas", type=int, default=1, help="replicas when not autoscaling (default 1)"
    )
    parser.add_argument(
        "--autoscaling-config",
        type=json.loads,
        default=None,
        metavar="JSON",
        help='Ray Serve autoscaling_config as JSON, e.g. \'{"min_replicas": 1, "max_replicas": 4, '
        '"target_ongoing_requests": 8, "policy": {"policy_function": '
        '"coreserve.ray:pending_requests_policy"}}\' (default: none, --num-replicas)',
    )
    parser.add_argument(
        "--replica-cpus", type=float, default=1.0, help="CPUs Ray reserves for each replica (default 1)"
    )
    parser.add_argument(
        "--serve-host", default="127.0.0.1", help="address Ray Serve's HTTP proxy binds (default 127.0.0.1)"
    )
    parser.add_argument(
        "--serve-port", type=int, default=8000, help="port of Ray Serve's HTTP proxy (default 8000)"
    )
    parser.add_argument(
        "--models-per-replica",
        type=int,
        default=0,
        metavar="N",
        help="many-model repositories: each replica loads the models its requests name, at most N "
        "(least recently used unloaded first), and Ray Serve routes each model to replicas holding it "
        "(default 0: every replica serves the whole repository)",
    )
    parser.add_argument(
        "--proxy-location",
        choices=("EveryNode", "HeadOnly", "Disabled"),
        default="EveryNode",
        help="where Ray Serve runs HTTP proxies (default EveryNode: one per node, as Ray's default)",
    )
    parser.add_argument(
        "--detach",
        action="store_true",
        help="return once deployed and leave the application running on the cluster "
        "(default: serve until SIGINT/SIGTERM, then delete it)",
    )
    return parser


def deployment_options(args: argparse.Namespace) -> dict[str, Any]:
    """The Ray Serve deployment options the flags ask for."""
    options: dict[str, Any] = {"ray_actor_options": {"num_cpus": args.replica_cpus}}
    if args.autoscaling_config is not None:
        options["autoscaling_config"] = args.autoscaling_config
    else:
        options["num_replicas"] = args.num_replicas
    return options


def main(argv: Sequence[str]) -> int:
    """Deploys the application; unless --detach, serves until SIGINT or SIGTERM, then deletes it."""
    args, rest = _parser().parse_known_args(argv)
    options = server_options(parse_serve_args(rest))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import ray
    from ray import serve

    ray.init(address=args.address, logging_level=logging.WARNING)
    serve.start(
        proxy_location=args.proxy_location, http_options={"host": args.serve_host, "port": args.serve_port}
    )
    app = coreserve_app(
        options.model_repositories, {"options": options}, args.models_per_replica, **deployment_options(args)
    )
    serve.run(app, name=DEPLOYMENT_NAME, route_prefix="/")
    # The line tests and scripts wait for: every replica has started and is healthy.
    print(f"coreserve ray: serving at http://{args.serve_host}:{args.serve_port}", flush=True)
    if args.detach:
        return 0
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    stop.wait()
    logger.info("signal received; deleting the Ray Serve application %r", DEPLOYMENT_NAME)
    serve.delete(DEPLOYMENT_NAME)
    return 0
