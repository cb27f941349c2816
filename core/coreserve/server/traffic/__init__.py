"""The data plane's routing step between a model's versions: weights and sticky keys, shadow
copies compared with the client's answers, and canary rollouts that move the weights.

May import the repository (which owns each model's policy), the scheduling statistics and the
types; never a frontend.
"""

from __future__ import annotations

from coreserve.server.traffic._control import ROLLOUT_ACTIONS, TRAFFIC_CALLS, RolloutPeers, TrafficControl
from coreserve.server.traffic._router import KEY_HEADER, KEY_PARAMETER, TrafficRouter

__all__ = [
    "KEY_HEADER",
    "KEY_PARAMETER",
    "ROLLOUT_ACTIONS",
    "TRAFFIC_CALLS",
    "RolloutPeers",
    "TrafficControl",
    "TrafficRouter",
]
