"""The repository API's traffic endpoints, as the frontends call them: a model's policy read
and set, and its rollout started, read, promoted or aborted.

A policy set here is a change (`SetTraffic`): in a server of several workers every worker
applies it, or none does. Rollouts run in one process: the server's, or worker 0 in a server of
several, where the other workers send their rollout calls (over the supervisor's line) and
count their requests in windows that worker 0 opens, reads and closes (`_windows`).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from coreserve.errors import (
    CoreserveError,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
)
from coreserve.repository.manager import ModelRepository
from coreserve.repository.model import Model
from coreserve.repository.traffic.policy import TrafficPolicy, policy_from_document
from coreserve.server.changes import Change, SetTraffic
from coreserve.server.traffic._rollout import Rollout, plan_from_document
from coreserve.server.traffic._router import TrafficRouter
from coreserve.server.traffic._windows import WINDOWS_CALL, Gathers, Windows, WorkerWindows

logger = logging.getLogger(__name__)
ROLLOUT_ACTIONS = ("start", "status", "promote", "abort")
# What a worker asks worker 0 of its rollouts: an action, or the index's summaries.
ROLLOUT_CALL = "rollout"
INDEX_ACTION = "index"
# The asks of the supervisor's line that `TrafficControl.answer` answers.
TRAFFIC_CALLS = (ROLLOUT_CALL, WINDOWS_CALL)


class RolloutPeers(Gathers, Protocol):
    """What rollouts need of the other workers of a server of several."""

    @property
    def index(self) -> int:
        """This worker's."""

    async def from_worker_0(self, what: dict[str, Any]) -> Any:
        """Worker 0's answer to `what` (its error raised here)."""


class ChangesEverywhere(Protocol):
    """What the control needs of the data plane: its changes, made in every worker."""

    @property
    def peers(self) -> RolloutPeers | None:
        """None in a server of one process."""

    async def change(self, change: Change) -> None: ...


class TrafficControl:
    """Reads and changes the traffic of the repository's models."""

    def __init__(self, repository: ModelRepository, router: TrafficRouter, server: ChangesEverywhere) -> None:
        self._repository = repository
        self._router = router
        self._server = server

    async def policy(self, name: str) -> dict[str, Any]:
        """The model's policy as the API answers it, with its rollout's state if it has one."""
        model = self._repository.get(name)
        answer = (model.traffic or TrafficPolicy()).as_dict()
        try:
            answer["rollout"] = await self.rollout(name, "status")
        except NotFoundError:  # (the model is found above: it has no rollout)
            pass
        except CoreserveError as exc:  # worker 0 starts again, and its rollouts went with it
            logger.warning(
                "model '%s': the traffic answer shows no rollout: worker 0 did not answer (%s)", name, exc
            )
        return answer

    async def with_rollouts(self, entries: list[dict[str, str]]) -> list[dict[str, str]]:
        """The repository index's entries, those of a model with a rollout saying where it stands
        (`rollout`: its state and its last move; an extra field, as the HTTP index has others)."""
        peers = self._server.peers
        if peers is not None and peers.index != 0:
            try:
                summaries = await peers.from_worker_0({"call": ROLLOUT_CALL, "action": INDEX_ACTION})
            except CoreserveError as exc:  # worker 0 starts again: the index goes without them
                logger.warning("the repository index shows no rollout: worker 0 did not answer (%s)", exc)
                return entries
        else:
            summaries = self._summaries()
        if summaries:
            for entry in entries:
                if entry["name"] in summaries:
                    entry["rollout"] = summaries[entry["name"]]
        return entries

    def _summaries(self) -> dict[str, str]:
        """Each rollout's state and last move, by model (rollouts of models served still)."""
        summaries = {}
        for name, rollout in self._router.rollouts.items():
            if self._is_current(rollout.model):
                step = rollout.moves[-1].split(" ", 1)[1] if rollout.moves else ""  # (after its time)
                summaries[name] = f"{rollout.state.value}: {step if rollout.running() else rollout.reason}"
        return summaries

    async def set_policy(self, name: str, document: object) -> dict[str, Any]:
        """Replaces the model's policy (`{}` clears it), in every worker or in none."""
        policy = policy_from_document(document)
        self._check(name, policy)
        await self._server.change(SetTraffic(name, policy.as_dict()))
        return await self.policy(name)

    def apply(self, change: SetTraffic) -> None:
        """Makes a SetTraffic change in this process (checked again: this worker's models; in
        the process that runs the model's rollout, a change not of the rollout is refused)."""
        policy = policy_from_document(change.policy)
        model = self._check(change.name, policy)
        if change.rollout:
            self._router.check_rollout_move(model)
        else:
            self._router.check_policy_change(model)
        model.traffic = None if policy.empty else policy

    async def rollout(self, name: str, action: str, document: object = None) -> dict[str, Any]:
        """Starts a rollout of the plan `document`, or reads, promotes or aborts the running one
        (in worker 0, where the server has several)."""
        if action not in ROLLOUT_ACTIONS:
            raise InvalidArgumentError(
                f"no rollout action '{action}' (actions: {', '.join(ROLLOUT_ACTIONS)})"
            )
        self._repository.get(name)  # (an unknown model is not found here, in every worker)
        peers = self._server.peers
        if peers is not None and peers.index != 0:
            ask = {"call": ROLLOUT_CALL, "name": name, "action": action, "plan": document}
            status: dict[str, Any] = await peers.from_worker_0(ask)
            return status
        return await self._rollout_here(name, action, document)

    async def answer(self, ask: dict[str, Any]) -> Any:
        """A worker's answer to an ask of `TRAFFIC_CALLS`: its windows, or (worker 0's, which
        runs the rollouts) another worker's rollout call."""
        if ask["call"] == WINDOWS_CALL:
            return await self._router.windows.answer(ask)
        if ask["action"] == INDEX_ACTION:
            return self._summaries()
        return await self._rollout_here(str(ask["name"]), str(ask["action"]), ask.get("plan"))

    async def _rollout_here(self, name: str, action: str, document: object) -> dict[str, Any]:
        model = self._repository.get(name)
        if action == "start":
            plan = plan_from_document(document)
            windows = self._windows()
            started = self._router.start_rollout(model, plan, self._set_weights, self._is_current, windows)
            await started.first_step()
            return await started.status()
        rollout: Rollout | None = self._router.rollouts.get(name)
        if rollout is None:
            raise NotFoundError(f"model '{name}' has no rollout")
        rollout.settle()  # (within the second its task takes to notice)
        if action == "promote":
            await rollout.promote()
        elif action == "abort":
            await rollout.abort()
        return await rollout.status()

    def _windows(self) -> Windows:
        """Where a rollout's requests are counted: in this process, or in every worker."""
        peers = self._server.peers
        return WorkerWindows(peers) if peers is not None else self._router.windows

    async def _set_weights(self, model: Model, policy: TrafficPolicy) -> None:
        """A rollout's move: made only on the model object it started on."""
        if not self._is_current(model):
            raise UnavailableError(f"model '{model.name}' was unloaded or loaded again during its rollout")
        await self._server.change(SetTraffic(model.name, policy.as_dict(), rollout=True))

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
