"""The routing step: which version serves a request that names none, and what else happens to
it under its model's traffic policy (a shadow copy, a rollout's observation).

A request that names a version never comes here. Neither does a request for a model without
a policy: the data plane asks the model first, so such requests pay an attribute read.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from coreserve.errors import InvalidArgumentError, UnavailableError
from coreserve.repository.model import Model, ModelVersion
from coreserve.repository.traffic.policy import TrafficPolicy
from coreserve.server.traffic._rollout import Rollout, RolloutPlan
from coreserve.server.traffic._shadow import ShadowCopies, Submit
from coreserve.server.traffic._windows import CountedSink, ProcessWindows, Windows
from coreserve.types import InferenceRequest, ResponseSink

# The request parameter that keeps a request on one version, and the HTTP header that does.
KEY_PARAMETER = "coreserve_traffic_key"
KEY_HEADER = KEY_PARAMETER.replace("_", "-")
RUNNING_REFUSAL = "a rollout running, which sets its weights; promote or abort it first"

SetPolicy = Callable[[Model, TrafficPolicy], Awaitable[None]]


class TrafficRouter:
    """Routes requests by their model's policy; holds the shadow copies' counts, the rollouts
    (run in this process) and the windows of this process's requests under a rollout."""

    def __init__(self) -> None:
        self.shadows = ShadowCopies()
        self.rollouts: dict[str, Rollout] = {}
        self.windows = ProcessWindows()

    def route(self, model: Model, request: InferenceRequest) -> ModelVersion:
        """The version that serves `request`, which names none; the request names it from now on
        (its statistics, trace and log, and a worker it is forwarded to, see that version). A
        policy of a shadow alone leaves the clients to the latest version but the shadow's."""
        value = request.parameters.pop(KEY_PARAMETER, None) if request.parameters else None
        key = request.traffic_key  # the HTTP header's, which wins over the parameter
        if key is None and value is not None:
            key = str(value)
        target = self.pick(model, key)
        request.model_version = str(target.version)
        request.routed = True
        return target

    def pick(self, model: Model, key: str | None) -> ModelVersion:
        """The version that serves a request of `model` that names none, with the traffic key
        `key` (None: drawn at random by the weights): the latest, where the model has no policy."""
        policy = model.traffic
        number = policy.pick(key) if policy is not None else None
        if number is None and policy is not None and policy.shadow is not None:
            others = [v for v in model.serving_versions() if v != policy.shadow.version]
            number = others[-1] if others else None
        return model.version("" if number is None else str(number))

    def watched(
        self,
        sink: ResponseSink,
        request: InferenceRequest,
        target: ModelVersion,
        policy: TrafficPolicy | None,
        submit: Submit,
    ) -> ResponseSink:
        """The sink of `request`, which its model's `policy` routed to `target`: one that copies
        the request to the policy's shadow once answered (where the shadow is another version and
        `target` answers each request once: not decoupled), and one that counts how `target`
        answers it (where a rollout observes the model); else `sink`."""
        name = request.model_name
        shadow = policy.shadow if policy is not None else None
        if (
            shadow is not None
            and shadow.version != target.version
            and not target.config.model_transaction_policy.decoupled
        ):
            sink = self.shadows.watch(sink, shadow, request, submit)
        if self.windows.observing(name):
            sink = CountedSink(sink, self.windows, name, target.version)
        return sink

    def start_rollout(
        self,
        model: Model,
        plan: RolloutPlan,
        set_policy: SetPolicy,
        is_current: Callable[[Model], bool],
        windows: Windows,
    ) -> Rollout:
        """Starts a rollout of `plan` on `model`, counted in `windows`; its stable version is the
        one the policy gives most weight (the latest that serves but the candidate, without a
        policy)."""
        self.check_policy_change(model, "a rollout running; promote or abort it first")
        candidate = model.versions.get(plan.candidate)
        if candidate is None or not candidate.takes_requests:
            serving = ", ".join(map(str, model.serving_versions())) or "none"
            raise InvalidArgumentError(
                f"rollout candidate version {plan.candidate} of model '{model.name}' does not serve "
                f"(serving: {serving}); load it first"
            )
        stable = _stable_version(model, plan.candidate)
        shadow = model.traffic.shadow if model.traffic is not None else None

        async def apply(weights: TrafficPolicy) -> None:
            await set_policy(model, TrafficPolicy(weights.weights, shadow))

        rollout = Rollout(model, stable, plan, apply, is_current, windows)
        self.rollouts[model.name] = rollout
        rollout.start()
        return rollout

    def check_policy_change(
        self,
        model: Model,
        refusal: str = "a rollout running, which sets its weights; promote or abort it first",
    ) -> None:
        """Refuses a change of the weights by hand while a rollout moves them. A rollout of a
        model unloaded or loaded again since is over: it stops, and the change goes ahead."""
        rollout = self.rollouts.get(model.name)
        if rollout is None or not rollout.running():
            return
        if rollout.model is not model:
            rollout.stop(f"model '{model.name}' was unloaded or loaded again")
            return
        raise InvalidArgumentError(f"model '{model.name}' has {refusal}")

    def check_rollout_move(self, model: Model) -> None:
        """Refuses, in the process that runs the model's rollout, a move of it that comes after
        the model was unloaded or loaded again (another process has no rollout to check)."""
        rollout = self.rollouts.get(model.name)
        if rollout is not None and (rollout.model is not model or not rollout.running()):
            raise UnavailableError(f"model '{model.name}' was unloaded or loaded again during its rollout")

    def close(self) -> None:
        for rollout in self.rollouts.values():
            rollout.close()


def _stable_version(model: Model, candidate: int) -> int:
    """The version the policy gives most weight, the candidate aside (a candidate that has all
    of it already is refused); without weights, the latest version but the candidate's (and a
    shadow's)."""
    policy = model.traffic
    weighted = [(weight, version) for version, weight in (policy.weights if policy else ()) if weight > 0]
    if weighted:
        heaviest = max(((w, v) for w, v in weighted if v != candidate), default=None)
        if heaviest is None:
            raise InvalidArgumentError(_takes_every_request(model, candidate))
        return heaviest[1]
    shadow = policy.shadow.version if policy is not None and policy.shadow is not None else None
    others = [number for number in model.serving_versions() if number not in (candidate, shadow)]
    if not others:
        raise InvalidArgumentError(
            f"model '{model.name}' serves no version beside candidate {candidate} to compare it with"
        )
    return others[-1]


def _takes_every_request(model: Model, candidate: int) -> str:
    return (
        f"rollout candidate version {candidate} of model '{model.name}' takes every request already; "
        "set the weights of the version it replaces first"
    )
