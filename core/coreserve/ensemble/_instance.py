"""Running an ensemble request: each step through its own model's scheduler, as soon as its
inputs exist, with independent steps at the same time.

Tensors pass from step to step as the arrays they are (no copies, no re-encoding; a batch of 1
added or taken off between a model that batches and one that does not, as Triton does). A step of
a decoupled model may answer many times: each of its responses continues the pipeline on its
own, and every run that completes the ensemble's outputs is one response of the ensemble.

As in Triton: only the steps the requested outputs need run (the others are pruned); an
optional ensemble input the request left out, or an output a step did not produce, is an
absent tensor: a step reading it runs without that input (its model refuses the request if the
input is required), and the response leaves it out. An ensemble request's compute times in
the statistics are the sums of those of the step requests it made.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence

import numpy as np

from coreserve.backend.api import InferenceClient
from coreserve.backend.responder import Responder
from coreserve.ensemble._graph import EnsembleGraph, Step
from coreserve.ensemble._read_ahead import ReadAhead
from coreserve.errors import CancelledError, CoreserveError, InternalError
from coreserve.types import ComputeSums, InferenceRequest

Tensors = dict[str, np.ndarray | None]  # None: absent (left out by the request, or by a step)
DEFAULT_INFLIGHT = 1024


def _no_step_before() -> bool:
    """The top of the pipeline: no decoupled step it runs after has anything left to send."""
    return True


class EnsembleInstance:
    """Executes ensemble requests; many at once, since it only waits on the composing models."""

    def __init__(
        self, graph: EnsembleGraph, client: InferenceClient, decoupled: bool, inflight: int = 0
    ) -> None:
        self._graph = graph
        self._client = client
        self._decoupled = decoupled
        self.concurrency = inflight or DEFAULT_INFLIGHT

    async def execute(self, requests: Sequence[InferenceRequest], responder: Responder) -> None:
        await asyncio.gather(*(self._serve(request, responder) for request in requests))

    async def close(self) -> None:
        return None

    async def _serve(self, request: InferenceRequest, responder: Responder) -> None:
        answered = False
        request.compute_sums = ComputeSums()  # its steps add their compute times here
        try:
            tensors: Tensors = {name: None for name in self._graph.inputs} | dict(request.inputs)
            pruned = self._graph.pruned_steps(request.requested_outputs)
            async for outputs, drained in self._run(request, tensors, pruned, _no_step_before):
                final = drained or not self._decoupled  # (Triton's: the flag rides on the response
                responder.send(request, outputs, final=final)  # that finds the pipeline drained)
                answered = True
                if final:
                    return
        except CoreserveError as exc:
            responder.send_error(request, exc)
            return
        if self._decoupled:
            responder.send_final(request)
        elif not answered:
            responder.send_error(
                request, InternalError(f"ensemble '{self._graph.name}' produced no response")
            )

    async def _run(
        self, request: InferenceRequest, tensors: Tensors, done: frozenset[int], drained: Callable[[], bool]
    ) -> AsyncIterator[tuple[dict[str, np.ndarray], bool]]:
        """Runs every step it can (those `done` are finished or pruned); yields the ensemble
        outputs of each run that completes those the request asks for, with whether the
        pipeline has drained by then (`drained`: whether the decoupled steps it runs after have
        ended and every response they sent has run)."""
        finished = set(done)
        running: dict[asyncio.Task[Tensors], Step] = {}
        deferred: list[Step] = []  # decoupled steps: they fork the run, so they go last
        try:
            while True:
                if request.is_cancelled():  # no further step starts; those running were cancelled
                    raise CancelledError(f"request for ensemble '{self._graph.name}' was cancelled")
                for step in self._ready(tensors, finished, running, deferred):
                    if step.index in self._graph.decoupled_steps:
                        deferred.append(step)
                    else:
                        running[asyncio.create_task(self._call(request, step, tensors))] = step
                if not running:
                    break
                completed, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in completed:
                    step = running.pop(task)
                    tensors.update(task.result())
                    finished.add(step.index)
        finally:
            for task in running:
                task.cancel()
        if deferred:
            step = deferred[0]
            ahead = ReadAhead(self._stream(request, step, tensors))
            async for outputs in ahead.items():
                async for result in self._run(
                    request,
                    {**tensors, **outputs},
                    frozenset(finished | {step.index}),
                    lambda: ahead.drained and drained(),
                ):
                    yield result
            return
        wanted = self._graph.wanted_outputs(request.requested_outputs)
        if all(name in tensors for name in wanted):
            bridges = self._graph.output_bridges
            answer = {name: tensor for name in wanted if (tensor := tensors[name]) is not None}
            yield (
                {name: bridges[name].fit(t) if name in bridges else t for name, t in answer.items()},
                drained(),
            )

    def _ready(
        self,
        tensors: Tensors,
        finished: set[int],
        running: dict[asyncio.Task[Tensors], Step],
        deferred: list[Step],
    ) -> list[Step]:
        started = {step.index for step in running.values()} | {step.index for step in deferred}
        return [
            step
            for step in self._graph.steps
            if step.index not in finished
            and step.index not in started
            and all(tensor in tensors for tensor in step.inputs.values())
        ]

    def _step_request(self, request: InferenceRequest, step: Step, tensors: Tensors) -> InferenceRequest:
        bridges = self._graph.input_bridges.get(step.index, {})
        child = InferenceRequest(
            model_name=step.model_name,
            model_version=step.model_version,
            id=request.id,
            inputs={
                model_input: bridges[model_input].fit(array) if model_input in bridges else array
                for model_input, tensor in step.inputs.items()
                if (array := tensors[tensor]) is not None
            },
            parameters=dict(request.parameters),
            requested_outputs=tuple(step.outputs),
            traffic_key=request.traffic_key,  # a step that names no version lands where its key says
            counts_into=request.compute_sums,
        )
        child.trace_as_child_of(request)  # a traced ensemble traces its steps as its children
        return child

    def _failed(self, error: CoreserveError) -> CoreserveError:
        """A step's error as the ensemble's, in Triton's words (the step's message names its model)."""
        return type(error)(f"in ensemble '{self._graph.name}', {error.message}")

    def _renamed(self, step: Step, outputs: dict[str, np.ndarray]) -> Tensors:
        """The step's outputs as the ensemble's tensors; one it did not produce is absent."""
        return {tensor: outputs.get(output) for output, tensor in step.outputs.items()}

    async def _call(self, request: InferenceRequest, step: Step, tensors: Tensors) -> Tensors:
        child = self._step_request(request, step, tensors)
        forget = request.on_cancel(child.cancel)  # cancelling the ensemble's request cancels its steps
        try:
            response = await self._client.infer(child)
        except CoreserveError as exc:
            raise self._failed(exc) from None
        finally:
            forget()
        return self._renamed(step, dict(response.outputs))

    async def _stream(
        self, request: InferenceRequest, step: Step, tensors: Tensors
    ) -> AsyncIterator[Tensors]:
        child = self._step_request(request, step, tensors)
        forget = request.on_cancel(child.cancel)
        try:
            async for response in self._client.stream(child):
                if response.error is not None:  # (as Triton: any error of a step fails the ensemble)
                    raise response.error
                yield self._renamed(step, dict(response.outputs))
        except CoreserveError as exc:
            raise self._failed(exc) from None
        finally:
            forget()
