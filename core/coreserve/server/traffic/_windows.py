"""What the versions under a rollout answered during its step: each process's windows, and the
rollout's reading of them (this process's alone, or every worker's added up).

A window holds one version's failures and the latencies of its answers (the first ones, enough
for a p99). Each process counts the requests it routed; in a server of several workers the
rollout, run by worker 0, has every worker open, read and close its windows over the line to
the supervisor and adds them up (`WorkerWindows`). A worker started again during a step counts
from the step after.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from coreserve.errors import CancelledError, CoreserveError
from coreserve.types import InferenceResponse, ResponseSink

# Latencies kept per version and step in a server (each process keeps its share of them).
MAX_SAMPLES = 100_000


@dataclass
class Window:
    """What one version answered during the current step."""

    latencies_s: list[float] = field(default_factory=list)
    failures: int = 0

    @property
    def requests(self) -> int:
        return len(self.latencies_s) + self.failures

    def error_rate(self) -> float:
        return self.failures / self.requests if self.requests else 0.0

    def p99_s(self) -> float:
        if not self.latencies_s:
            return 0.0
        ordered = sorted(self.latencies_s)
        return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]

    def as_dict(self) -> dict[str, Any]:
        return {"latencies_s": self.latencies_s, "failures": self.failures}


class Windows(Protocol):
    """A rollout's windows, wherever they are counted."""

    async def open(self, model: str, versions: list[int]) -> None:
        """Starts counting the versions' requests anew (a step begins)."""

    async def read(self, model: str) -> dict[int, Window]:
        """What each version answered since the step began."""

    async def close(self, model: str) -> None:
        """Stops counting (the rollout ended)."""


class ProcessWindows:
    """The windows of the models under a rollout, as this process counts them."""

    def __init__(self, max_samples: int = MAX_SAMPLES) -> None:
        self.max_samples = max_samples
        self._models: dict[str, dict[int, Window]] = {}

    def observing(self, model: str) -> bool:
        return model in self._models

    def observe(self, model: str, version: int, latency_s: float, ok: bool) -> None:
        """One request a version answered (or failed), counted where its model has windows."""
        window = self._models.get(model, {}).get(version)
        if window is None:
            return
        if not ok:
            window.failures += 1
        elif len(window.latencies_s) < self.max_samples:
            window.latencies_s.append(latency_s)

    async def open(self, model: str, versions: list[int]) -> None:
        self._models[model] = {version: Window() for version in versions}

    async def read(self, model: str) -> dict[int, Window]:
        return self._models.get(model, {})

    async def close(self, model: str) -> None:
        self._models.pop(model, None)

    async def answer(self, ask: dict[str, Any]) -> dict[str, Any] | None:
        """A worker's answer to worker 0's `WorkerWindows` (`what`: open, read or close)."""
        model = str(ask["model"])
        if ask["what"] == "open":
            self.max_samples = int(ask["max_samples"])
            await self.open(model, [int(version) for version in ask["versions"]])
        elif ask["what"] == "close":
            await self.close(model)
        else:
            return {str(version): window.as_dict() for version, window in (await self.read(model)).items()}
        return None


class CountedSink:
    """A request's sink that counts, in this process's windows, how its version answered it:
    failed (a cancellation is the client's doing, not counted), or answered with its last
    response after how long."""

    __slots__ = ("_model", "_sink", "_started", "_version", "_windows")

    def __init__(self, sink: ResponseSink, windows: ProcessWindows, model: str, version: int) -> None:
        self._sink = sink
        self._windows = windows
        self._model = model
        self._version = version
        self._started = time.perf_counter()

    @property
    def done(self) -> bool:
        return self._sink.done

    def send(self, response: InferenceResponse | None, final: bool) -> None:
        if final and not self._sink.done:
            self._count(ok=True)
        self._sink.send(response, final)

    def fail(self, error: CoreserveError) -> None:
        if not self._sink.done and not isinstance(error, CancelledError):
            self._count(ok=False)
        self._sink.fail(error)

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

    async def open(self, model: str, versions: list[int]) -> None:
        share = MAX_SAMPLES // self._peers.workers  # of the latencies each worker keeps
        await self._peers.from_every_worker(
            {"call": WINDOWS_CALL, "what": "open", "model": model, "versions": versions, "max_samples": share}
        )

    async def read(self, model: str) -> dict[int, Window]:
        answers = await self._peers.from_every_worker({"call": WINDOWS_CALL, "what": "read", "model": model})
        return added_up(answer for answer in answers if answer)

    async def close(self, model: str) -> None:
        await self._peers.from_every_worker({"call": WINDOWS_CALL, "what": "close", "model": model})


def added_up(answers: Iterable[dict[str, Any]]) -> dict[int, Window]:
    """Every worker's windows as one: failures summed, latencies put together."""
    total: dict[int, Window] = {}
    for answer in answers:
        for version, window in answer.items():
            into = total.setdefault(int(version), Window())
            into.failures += int(window["failures"])
            into.latencies_s.extend(float(latency) for latency in window["latencies_s"])
    return total
