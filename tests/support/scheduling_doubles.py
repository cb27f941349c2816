"""Test doubles for driving the schedulers in-process: an instance and a sink that record.

`RecordingInstance` is a real `ModelInstance` (a plugin's shape, written for the tests): it
records the ids of every batch it is given and echoes each request's inputs back, and it
holds a request whose id the test lists in `holds` until the test releases it. So a test
decides exactly when an instance is busy, and asserts on which requests went together and in
which order their responses left, never on how long anything took.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import numpy as np
from google.protobuf import text_format

from coreserve.backend.responder import Responder
from coreserve.config.signature import ModelSignature
from coreserve.errors import CoreserveError
from coreserve.protos.model_config_pb2 import ModelConfig
from coreserve.scheduling._scheduler import Scheduler
from coreserve.scheduling.statistics import ModelStatistics
from coreserve.types import InferenceRequest, InferenceResponse


class RecordingInstance:
    """An instance that records its batches and echoes IN to OUT; it may hold requests."""

    def __init__(self, name: str = "instance0", holds: dict[str, asyncio.Event] | None = None) -> None:
        self.name = name
        self.batches: list[list[str]] = []
        self.requests: list[InferenceRequest] = []  # every request it executed, in order
        self.holds = holds if holds is not None else {}
        self.closed = False

    async def execute(self, requests: Sequence[InferenceRequest], responder: Responder) -> None:
        self.batches.append([request.id for request in requests])
        self.requests.extend(requests)
        for request in requests:
            hold = self.holds.get(request.id)
            if hold is not None:
                await hold.wait()
        for request in requests:
            responder.send(request, {"OUT": request.inputs["IN"]})

    async def close(self) -> None:
        self.closed = True


class RecordingSink:
    """A request's sink that appends `(request id, what happened)` to a log shared by a test."""

    def __init__(self, request_id: str, log: list[tuple[str, str]]) -> None:
        self._id = request_id
        self._log = log
        self._done = False
        self.responses: list[InferenceResponse | None] = []
        self.error: CoreserveError | None = None

    @property
    def done(self) -> bool:
        return self._done

    def send(self, response: InferenceResponse | None, final: bool) -> None:
        self._done = self._done or final
        self.responses.append(response)
        self._log.append((self._id, "final" if final else "response"))

    def fail(self, error: CoreserveError) -> None:
        self._done = True
        self.error = error
        self._log.append((self._id, "error"))


def model_config(text: str) -> ModelConfig:
    """A model configuration from config.pbtxt text."""
    config: ModelConfig = text_format.Parse(text, ModelConfig())
    return config


def signature_and_statistics(config: ModelConfig) -> tuple[ModelSignature, ModelStatistics]:
    return ModelSignature(config), ModelStatistics(config.name, 1)


def make_request(
    request_id: str,
    log: list[tuple[str, str]],
    *,
    rows: int = 1,
    width: int = 1,
    **parameters: int | bool | str,
) -> InferenceRequest:
    """A request of `rows` rows of `width` INT32 values, answered into a RecordingSink."""
    values = np.full((rows, width), len(log), dtype=np.int32)
    request = InferenceRequest(
        "m", {"IN": values}, id=request_id, parameters=dict(parameters), batch_size=rows
    )
    request.sink = RecordingSink(request_id, log)
    return request


def recording_sink(request: InferenceRequest) -> RecordingSink:
    """The RecordingSink that `make_request` gave a request."""
    assert isinstance(request.sink, RecordingSink)
    return request.sink


async def settle(rounds: int = 20) -> None:
    """Lets every task that can run on the loop run: the scheduler forms and sends its batches."""
    for _ in range(rounds):
        await asyncio.sleep(0)


async def finish(scheduler: Scheduler) -> None:
    """Lets the scheduler send what it will, then closes it (running batches end first)."""
    await settle()
    await scheduler.close(timeout=30)


def run_scenario(scenario: Callable[[], Awaitable[None]]) -> None:
    """Runs a test's coroutine on a new event loop, bounded so that a hang fails the test."""
    asyncio.run(asyncio.wait_for(scenario(), 60))
