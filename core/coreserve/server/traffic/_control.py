"""The repository API's traffic endpoints, as the frontends call them: a model's policy read
and set, and its rollout started, read, promoted or aborted.

A policy set here is a change (`SetTraffic`): in a server of several workers every worker
applies it, or none does. Rollouts run in a server of one process: their guards judge the
requests that process answered.
"""

from __future__ import annotations

from typing import Any, Protocol

from coreserve.errors import (
    CoreserveError,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
    UnsupportedError,
)
from coreserve.repository.manager import ModelRepository
from coreserve.repository.model import Model
from coreserve.repository.traffic.policy import TrafficPolicy, policy_from_document
from coreserve.server.changes import Change, SetTraffic
from coreserve.server.traffic._rollout import plan_from_document
from coreserve.server.traffic._router import TrafficRouter

ROLLOUT_ACTIONS = ("start", "status", "promote", "abort")


class ChangesEverywhere(Protocol):
    """What the control needs of the data plane: its changes, made in every worker."""

    @property
    def peers(self) -> object:
        """None in a server of one process."""

    async def change(self, change: Change) -> None: ...


class TrafficControl:
    """Reads and changes the traffic of the repository's models."""

    def __init__(self, repository: ModelRepository, router: TrafficRouter, server: ChangesEverywhere) -> None:
        self._repository = repository
        self._router = router
        self._server = server

    def policy(self, name: str) -> dict[str, Any]:
        """The model's policy as the API answers it, with its rollout's state if it has one."""
        model = self._repository.get(name)
        answer = (model.traffic or TrafficPolicy()).as_dict()
        rollout = self._router.rollouts.get(name)
        if rollout is not None:
            answer["rollout"] = rollout.status()
        return answer

    def with_rollouts(self, entries: list[dict[str, str]]) -> list[dict[str, str]]:
        """The repository index's entries, those of a model with a rollout saying where it stands
        (`rollout`: its state and its last move; an extra field, as the HTTP index has others)."""
        for entry in entries:
            rollout = self._router.rollouts.get(entry["name"])
            if rollout is not None and self._is_current(rollout.model):
                step = rollout.moves[-1].split(" ", 1)[1] if rollout.moves else ""  # (after its time)
                entry["rollout"] = f"{rollout.state.value}: {step if rollout.running() else rollout.reason}"
        return entries

    async def set_policy(self, name: str, document: object) -> dict[str, Any]:
        """Replaces the model's policy (`{}` clears it), in every worker or in none."""
        policy = policy_from_document(document)
        model = self._check(name, policy)
        self._router.check_policy_change(model)
        await self._server.change(SetTraffic(name, policy.as_dict()))
        return self.policy(name)

    def apply(self, change: SetTraffic) -> None:
        """Makes a SetTraffic change in this process (checked again: this worker's models)."""
        policy = policy_from_document(change.policy)
        model = self._check(change.name, policy)
        model.traffic = None if policy.empty else policy

    async def rollout(self, name: str, action: str, document: object = None) -> dict[str, Any]:
        """Starts a rollout of the plan `document`, or reads, promotes or aborts the running one."""
        if action not in ROLLOUT_ACTIONS:
            raise InvalidArgumentError(
                f"no rollout action '{action}' (actions: {', '.join(ROLLOUT_ACTIONS)})"
            )
        model = self._repository.get(name)
        if action == "start":
            if self._server.peers is not None:
                raise UnsupportedError(
                    "rollouts run in a server of one process: each worker would judge only its own "
                    "requests (set the weights with the traffic endpoint instead)"
                )
            plan = plan_from_document(document)
            return self._router.start_rollout(model, plan, self._set_weights, self._is_current).status()
        rollout = self._router.rollouts.get(name)
        if rollout is None:
            raise NotFoundError(f"model '{name}' has no rollout")
        if action == "promote":
            await rollout.promote()
        elif action == "abort":
            await rollout.abort()
        return rollout.status()

    async def _set_weights(self, model: Model, policy: TrafficPolicy) -> None:
        """A rollout's move: made only on the model object it started on."""
        if not self._is_current(model):
            raise UnavailableError(f"model '{model.name}' was unloaded or loaded again during its rollout")
        await self._server.change(SetTraffic(model.name, policy.as_dict()))

    def _is_current(self, model: Model) -> bool:
        """Whether the repository still serves `model` (not unloaded, nor loaded again)."""
        try:
            return self._repository.get(model.name) is model
        except CoreserveError:
            return False

    def _check(self, name: str, policy: TrafficPolicy) -> Model:
        model = self._repository.get(name)
        policy.check_versions(name, model.serving_versions())
        return model
