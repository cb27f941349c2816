"""What the versions under a rollout answered during its step: each process's windows, and the
rollout's reading of them (this process's alone, or every worker's added up).

A window holds one version's answers and failures, and the latencies of its answers (the first
ones, enough for a p99). Each process counts the requests it routed; in a server of several
workers the rollout, run by worker 0, has every worker open, read and close its windows over
the line to the supervisor and adds them up (`WorkerWindows`). A worker started again during a
step counts from the step after. Each rollout names its windows with a token of its own: a
rollout that ended never reads or closes the windows of the model's next one.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from coreserve.errors import CancelledError, CoreserveError
from coreserve.responses import ForwardingSink
from coreserve.types import InferenceResponse, ResponseSink

# Latencies kept per version and step in a server (each process keeps its share of them).
MAX_SAMPLES = 100_000


@dataclass
class Window:
    """What one version answered during the current step."""

    successes: int = 0
    failures: int = 0
    latencies_s: list[float] = field(default_factory=list)  # of the first successes

    @property
    def requests(self) -> int:
        return self.successes + self.failures

    def error_rate(self) -> float:
        return self.failures / self.requests if self.requests else 0.0

    def p99_s(self) -> float:
        if not self.latencies_s:
            return 0.0
        ordered = sorted(self.latencies_s)
        return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]

    def as_dict(self, latencies: bool = True) -> dict[str, Any]:
        return {
            "successes": self.successes,
            "failures": self.failures,
            "latencies_s": self.latencies_s if latencies else [],
        }


def new_token() -> str:
    """A rollout's name for its windows."""
    return uuid.uuid4().hex


class Windows(Protocol):
    """The windows of rollouts, wherever they are counted; `token` names a rollout's."""

    async def open(self, model: str, versions: list[int], token: str) -> None:
        """Starts counting the versions' requests anew (a step begins)."""

    async def read(self, model: str, token: str, latencies: bool = True) -> dict[int, Window]:
        """What each version answered since the step began (without latencies: the counts)."""

    async def close(self, model: str, token: str) -> None:
        """Stops counting (the rollout ended)."""


class ProcessWindows:
    """The windows of the models under a rollout, as this process counts them."""

    def __init__(self, max_samples: int = MAX_SAMPLES) -> None:
        self.max_samples = max_samples
        self._models: dict[str, tuple[str, dict[int, Window]]] = {}  # by model: (token, windows)

    def observing(self, model: str) -> bool:
        return model in self._models

    def observe(self, model: str, version: int, latency_s: float, ok: bool) -> None:
        """One request a version answered (or failed), counted where its model has windows."""
        opened = self._models.get(model)
        window = opened[1].get(version) if opened is not None else None
        if window is None:
            return
        if not ok:
            window.failures += 1
            return
        window.successes += 1
        if len(window.latencies_s) < self.max_samples:
            window.latencies_s.append(latency_s)

    async def open(self, model: str, versions: list[int], token: str) -> None:
        self._models[model] = (token, {version: Window() for version in versions})

    async def read(self, model: str, token: str, latencies: bool = True) -> dict[int, Window]:
        opened = self._models.get(model)
        return opened[1] if opened is not None and opened[0] == token else {}

    async def close(self, model: str, token: str) -> None:
        opened = self._models.get(model)
        if opened is not None and opened[0] == token:
            del self._models[model]

    async def answer(self, ask: dict[str, Any]) -> dict[str, Any] | None:
        """A worker's answer to worker 0's `WorkerWindows` (`what`: open, read or close)."""
        model, token = str(ask["model"]), str(ask["token"])
        if ask["what"] == "open":
            self.max_samples = int(ask["max_samples"])
            await self.open(model, [int(version) for version in ask["versions"]], token)
        elif ask["what"] == "close":
            await self.close(model, token)
        else:
            windows = await self.read(model, token)
            return {
                str(version): window.as_dict(bool(ask["latencies"])) for version, window in windows.items()
            }
        return None


class CountedSink(ForwardingSink):
    """A request's sink that counts, in this process's windows, how its version answered it:
    failed (a cancellation is the client's doing, not counted), or answered with its last
    response after how long."""

    __slots__ = ("_model", "_started", "_version", "_windows")

    def __init__(self, sink: ResponseSink, windows: ProcessWindows, model: str, version: int) -> None:
        super().__init__(sink)
        self._windows = windows
        self._model = model
        self._version = version
        self._started = time.perf_counter()

    def send(self, response: InferenceResponse | None, final: bool) -> None:
        if final and not self._target.done:
            self._count(ok=True)
        self._target.send(response, final)

    def fail(self, error: CoreserveError) -> None:
        if not self._target.done and not isinstance(error, CancelledError):
            self._count(ok=False)
        self._target.fail(error)

    def _count(self, ok: bool) -> None:
        self._windows.observe(self._model, self._version, time.perf_counter() - self._started, ok)


class Gathers(Protocol):
    """What `WorkerWindows` needs of the line to the other workers."""

    @property
    def workers(self) -> int:
        """How many workers the server has."""

    async def from_every_worker(self, what: dict[str, Any]) -> list[Any]:
        """`what` asked of every worker, this one too: the answers of those that gave one."""


WINDOWS_CALL = "rollout_windows"


class WorkerWindows:
    """A rollout's windows in a server of several workers: every worker's, added up."""

    def __init__(self, peers: Gathers) -> None:
        self._peers = peers

    async def open(self, model: str, versions: list[int], token: str) -> None:
        share = MAX_SAMPLES // self._peers.workers  # of the latencies each worker keeps
        await self._ask("open", model, token, versions=versions, max_samples=share)

    async def read(self, model: str, token: str, latencies: bool = True) -> dict[int, Window]:
        return added_up(
            answer for answer in await self._ask("read", model, token, latencies=latencies) if answer
        )

    async def close(self, model: str, token: str) -> None:
        await self._ask("close", model, token)

    async def _ask(self, what: str, model: str, token: str, **more: object) -> list[Any]:
        ask = {"call": WINDOWS_CALL, "what": what, "model": model, "token": token, **more}
        return await self._peers.from_every_worker(ask)


def added_up(answers: Iterable[dict[str, Any]]) -> dict[int, Window]:
    """Every worker's windows as one: failures summed, latencies put together."""
    total: dict[int, Window] = {}
    for answer in answers:
        for version, window in answer.items():
            into = total.setdefault(int(version), Window())
            into.successes += int(window["successes"])
            into.failures += int(window["failures"])
            into.latencies_s.extend(float(latency) for latency in window["latencies_s"])
    return total
