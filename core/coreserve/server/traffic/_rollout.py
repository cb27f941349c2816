"""Canary rollouts run by the server: a candidate version's share of a model's traffic raised
step by step, each step held for a dwell time and judged against the stable version.

    plan    {"candidate": "2", "steps": [10, 50, 100], "dwell_s": 60,
             "max_error_rate_increase": 0.01, "max_p99_ratio": 1.5, "min_requests": 20}

At each step the weights are {stable: 100 - s, candidate: s}. When the step's dwell ends, the
requests the two versions answered during it are compared: a candidate whose error rate
exceeds the stable version's by more than `max_error_rate_increase`, or whose p99 latency is
more than `max_p99_ratio` times the stable version's, is rolled back (all traffic to the stable
version); otherwise the next step begins. After the last step the candidate is promoted (all
traffic to it). A step whose candidate answered fewer than `min_requests` is held another dwell,
its counts kept, rather than judged on too little; at the last step (100%) the stable version
answers only requests left over from the step before, so the candidate is judged against the
stable version's step before. Every move is logged and shown by `status()`.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from coreserve.errors import CoreserveError, InvalidArgumentError, UnavailableError, clipped
from coreserve.repository.model import Model
from coreserve.repository.traffic.policy import TrafficPolicy, bounded_number, version_number
from coreserve.server.traffic._windows import Window, Windows, new_token

logger = logging.getLogger(__name__)

# A step is judged when its dwell ends: a shorter dwell would judge (and hold) it without end.
MIN_DWELL_S = 0.1
_PLAN_FIELDS = ("candidate", "steps", "dwell_s", "max_error_rate_increase", "max_p99_ratio", "min_requests")


class RolloutState(enum.StrEnum):
    RUNNING = "RUNNING"
    PROMOTED = "PROMOTED"
    ROLLED_BACK = "ROLLED_BACK"
    ABORTED = "ABORTED"


@dataclass(frozen=True)
class RolloutPlan:
    """What a rollout does; see the module's docstring."""

    candidate: int
    steps: tuple[float, ...]
    dwell_s: float
    max_error_rate_increase: float = 0.01
    max_p99_ratio: float = 2.0
    min_requests: int = 20

    def as_dict(self) -> dict[str, object]:
        return {
            "candidate": str(self.candidate),
            "steps": list(self.steps),
            "dwell_s": self.dwell_s,
            "max_error_rate_increase": self.max_error_rate_increase,
            "max_p99_ratio": self.max_p99_ratio,
            "min_requests": self.min_requests,
        }


def plan_from_document(document: object) -> RolloutPlan:
    """The plan of a JSON document of the repository API; every mistake refused in one line."""
    if not isinstance(document, Mapping):
        raise InvalidArgumentError("a rollout plan must be a JSON object")
    unknown = sorted(set(document) - set(_PLAN_FIELDS))
    if unknown:
        raise InvalidArgumentError(
            f"unknown rollout plan field '{clipped(str(unknown[0]))}' (fields: {', '.join(_PLAN_FIELDS)})"
        )
    for required in ("candidate", "steps", "dwell_s"):
        if required not in document:
            raise InvalidArgumentError(f"a rollout plan needs '{required}'")
    candidate = version_number(document["candidate"], "rollout 'candidate'")
    steps = document["steps"]
    if not isinstance(steps, list) or not steps:
        raise InvalidArgumentError(
            "rollout 'steps' must be a list of the candidate's percents, e.g. [10, 50, 100]"
        )
    shares = tuple(bounded_number(step, "each rollout step", 0, 100, above_low=True) for step in steps)
    if any(later <= earlier for earlier, later in itertools.pairwise(shares)) or shares[-1] != 100:
        raise InvalidArgumentError(f"rollout 'steps' must rise and end at 100, got {list(shares)}")
    return RolloutPlan(
        candidate=candidate,
        steps=shares,
        dwell_s=bounded_number(document["dwell_s"], "rollout 'dwell_s'", MIN_DWELL_S, 7 * 24 * 3600),
        max_error_rate_increase=bounded_number(
            document.get("max_error_rate_increase", 0.01), "rollout 'max_error_rate_increase'", 0, 1
        ),
        max_p99_ratio=bounded_number(document.get("max_p99_ratio", 2.0), "rollout 'max_p99_ratio'", 1, 1e6),
        min_requests=_count(document.get("min_requests", 20), "rollout 'min_requests'"),
    )


def _count(value: object, where: str) -> int:
    number = bounded_number(value, where, 1, 1e9)
    if not number.is_integer():
        raise InvalidArgumentError(f"{where} must be a whole number, got {number:g}")
    return int(number)


class Rollout:
    """One model's rollout: the task that moves its weights, and what it saw.

    `model` is the model object the rollout started on: a model unloaded or loaded again since
    is another, and the rollout ends there (`stop`) rather than move the new one's weights.
    `windows` count what the two versions answer during each step.
    """

    def __init__(
        self,
        model: Model,
        stable: int,
        plan: RolloutPlan,
        apply: Callable[[TrafficPolicy], Awaitable[None]],
        is_current: Callable[[Model], bool],
        windows: Windows,
    ) -> None:
        self.model = model
        self._is_current = is_current
        self.stable = stable
        self.plan = plan
        self.state = RolloutState.RUNNING
        self.step = 0
        self.reason = ""
        self.moves: list[str] = []
        self._apply = apply
        self._moving = asyncio.Lock()  # one move of the weights at a time (the task's, or by hand)
        self._windows = windows
        self._token = new_token()  # its windows' name
        self._reference: Window | None = None  # the stable version's last judged step
        self._last: dict[int, Window] = {}  # the windows' counts as they were when the rollout ended
        self._task: asyncio.Task[None] | None = None
        self._first_step = asyncio.Event()  # set once the first step's weights are in place, or it ended
        self._first_error: CoreserveError | None = None  # what ended it before its first step
        self._closing: set[asyncio.Task[None]] = set()  # keeping its last windows, once ended

    def running(self) -> bool:
        return self.state is RolloutState.RUNNING

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"rollout:{self.model.name}")

    async def first_step(self) -> None:
        """Returns once the first step's weights are in place in every worker that serves, so
        that the answer to a start shows the weights it set. Raises the error that ended the
        rollout before its first step."""
        await self._first_step.wait()
        if self._first_error is not None:
            raise self._first_error

    async def status(self) -> dict[str, object]:
        """Where the rollout stands, with what the versions answered in the step so far."""
        if self.running():
            windows = await self._windows.read(self.model.name, self._token, latencies=False)
        else:
            if self._closing:  # its last windows still being kept
                await asyncio.wait(set(self._closing))
            windows = self._last
        candidate = windows.get(self.plan.candidate, Window())
        stable = windows.get(self.stable, Window())
        return {
            "state": self.state.value,
            "stable": str(self.stable),
            "step": self.step,
            "candidate_percent": self.plan.steps[self.step] if self.running() else None,
            "plan": self.plan.as_dict(),
            "reason": self.reason,
            "moves": list(self.moves),
            "window": {
                "candidate": {"requests": candidate.requests, "failures": candidate.failures},
                "stable": {"requests": stable.requests, "failures": stable.failures},
            },
        }

    async def promote(self) -> None:
        """Ends the rollout at once with the candidate taking every request."""
        await self._end(RolloutState.PROMOTED, "promoted on request")

    async def abort(self) -> None:
        """Ends the rollout at once with the stable version taking every request."""
        await self._end(RolloutState.ABORTED, "aborted on request")

    def settle(self) -> None:
        """Ends the rollout (ABORTED, with the reason) where its model was unloaded or loaded
        again since it started: the model that serves now has weights of its own."""
        if self.running() and not self._is_current(self.model):
            self.stop(f"model '{self.model.name}' was unloaded or loaded again")

    def stop(self, reason: str) -> None:
        """Ends the rollout where its model changed under it, leaving the weights as they are."""
        if self.running():
            self._mark_ended(RolloutState.ABORTED, reason, f"aborted: {reason}")
        self.close()

    def close(self) -> None:
        """Stops the task (the server stops); the weights stay as they are."""
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
        self._first_step.set()  # (a task cancelled before it ran never sets it)

    async def _run(self) -> None:
        try:
            while self.running():
                await self._set_step(self.step)
                self._first_step.set()
                verdict, holds = None, 0
                while verdict is None:  # a step with too few requests is held, its counts kept
                    await self._dwell()
                    if not self.running():  # promoted or aborted meanwhile
                        return
                    if not self._is_current(self.model):
                        raise UnavailableError(f"model '{self.model.name}' was unloaded or loaded again")
                    windows = await self._windows.read(self.model.name, self._token)
                    verdict = judge(self.plan, self.step, windows, self.stable, self._reference)
                    if verdict is None:
                        holds += 1
                        self._held(holds)
                if verdict:
                    await self._end(RolloutState.ROLLED_BACK, verdict)
                elif self.step + 1 == len(self.plan.steps):
                    await self._end(RolloutState.PROMOTED, "every step passed its guards")
                else:
                    self._reference = windows.get(self.stable)
                    self.step += 1
        except CoreserveError as exc:  # the model changed under it: unloaded, or loaded again
            logger.warning("rollout of model '%s' cannot go on: %s", self.model.name, exc.message)
            if not self._first_step.is_set():
                self._first_error = exc
            self.stop(f"the rollout could not go on: {exc.message}")
        finally:  # ended before its first step: a start waiting for it must not hang
            self._first_step.set()

    async def _dwell(self) -> None:
        """The step's dwell time, cut short where the rollout ended or its model changed (looked
        at every second: a model loaded again ends its rollout within a second)."""
        ends = time.monotonic() + self.plan.dwell_s
        while self.running() and self._is_current(self.model):
            left = ends - time.monotonic()
            if left <= 0:
                return
            await asyncio.sleep(min(left, 1.0))

    def _held(self, times: int) -> None:
        """One move (and one log line) per held step, its count of dwells kept up to date: a
        step held for days leaves one line."""
        what = f"step {self.step}: held, the candidate answered too few requests"
        if times == 1:
            self._move(what)
        else:
            self.moves[-1] = f"{_now()} {what} ({times} dwells)"

    async def _set_step(self, step: int) -> None:
        async with self._moving:
            if not self.running():
                return
            share = self.plan.steps[step]
            # Counting starts before the weights move: no request the step routes goes uncounted.
            await self._windows.open(self.model.name, [self.stable, self.plan.candidate], self._token)
            await self._apply(_weights(self.stable, 100 - share, self.plan.candidate, share))
            self._move(f"step {step}: candidate version {self.plan.candidate} at {share:g}%")

    async def _end(self, state: RolloutState, reason: str) -> None:
        """Ends the rollout with every request to the winner. Where that move fails (raises), a
        promote or abort by hand leaves the rollout going on as it was; the rollout's own move
        ends it ABORTED with the reason (`_run`), the weights as they were."""
        async with self._moving:
            if not self.running():
                return
            winner = self.plan.candidate if state is RolloutState.PROMOTED else self.stable
            await self._apply(_weights(winner, 100))
            move = f"{state.value.lower().replace('_', ' ')}: {reason}; version {winner} takes every request"
            self._mark_ended(state, reason, move)
        self.close()

    def _mark_ended(self, state: RolloutState, reason: str, move: str) -> None:
        """Marks the rollout ended, and keeps its last windows in a task a status waits for."""
        self.state = state
        self.reason = reason
        self._move(move)
        keeping = asyncio.create_task(self._keep_last_windows())
        self._closing.add(keeping)
        keeping.add_done_callback(self._closing.discard)

    async def _keep_last_windows(self) -> None:
        """Keeps the last step's windows for the status, and stops counting (where the workers
        cannot be asked now, their windows stay open until the model's next rollout)."""
        try:
            self._last = dict(await self._windows.read(self.model.name, self._token, latencies=False))
            await self._windows.close(self.model.name, self._token)
        except CoreserveError as exc:
            logger.warning("rollout of model '%s': its windows could not be closed: %s", self.model.name, exc)

    def _move(self, what: str) -> None:
        logger.info("rollout of model '%s': %s", self.model.name, what)
        self.moves.append(f"{_now()} {what}")


def judge(
    plan: RolloutPlan, step: int, windows: Mapping[int, Window], stable_version: int, reference: Window | None
) -> str | None:
    """The reason to roll back at the end of `step` ("" to go on; None: too few requests to
    judge). Where the step gives the stable version no share (the last one, at 100%), what it
    answered is left over from the step before, so the candidate is judged against `reference`,
    the stable version's last judged step (none before a plan's only step: no errors, no p99);
    likewise at a step in which the stable version answered nothing."""
    candidate = windows.get(plan.candidate, Window())
    stable = windows.get(stable_version, Window())
    if plan.steps[step] >= 100:
        stable = reference if reference is not None else Window()
    elif not stable.requests and reference is not None:
        stable = reference
    if candidate.requests < plan.min_requests:
        return None
    increase = candidate.error_rate() - stable.error_rate()
    if increase > plan.max_error_rate_increase:
        return (
            f"step {step}: candidate error rate {candidate.error_rate():.2%} against "
            f"{stable.error_rate():.2%} (allowed increase {plan.max_error_rate_increase:.2%})"
        )
    if stable.latencies_s and candidate.latencies_s:
        ratio = candidate.p99_s() / max(stable.p99_s(), 1e-9)
        if ratio > plan.max_p99_ratio:
            candidate_ms, stable_ms = candidate.p99_s() * 1e3, stable.p99_s() * 1e3
            return (
                f"step {step}: candidate p99 {candidate_ms:.3g} ms is {ratio:.3g}x the stable "
                f"version's {stable_ms:.3g} ms (allowed {plan.max_p99_ratio:g}x)"
            )
    return ""


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _weights(*pairs: float) -> TrafficPolicy:
    items = [(int(pairs[i]), float(pairs[i + 1])) for i in range(0, len(pairs), 2)]
    return TrafficPolicy(tuple(sorted((version, weight) for version, weight in items if weight > 0)))
