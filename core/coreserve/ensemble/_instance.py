"""Running an ensemble request: each step through its own model's scheduler, as soon as its
inputs exist, with independent steps at the same time.

Tensors pass from step to step as the arrays they are (no copies, no re-encoding; a batch of 1
added or taken off between a model that batches and one that does not, as Triton does). A step of
a decoupled model may answer many times: each of its responses continues the pipeline in a flow
of its own, beside the others (`_flows`), and every flow that completes the ensemble's outputs is
one response of the ensemble. `max_inflight_requests` bounds each step's requests in flight
(`_step_limits`).

As in Triton: only the steps the requested outputs need run (the others are pruned); an
optional ensemble input the request left out, or an output a step did not produce, is an
absent tensor: a step reading it runs without that input (its model refuses the request if the
input is required), and the response leaves it out. An ensemble request's compute times in
the statistics are the sums of those of the step requests it made.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Sequence

import numpy as np

from coreserve.backend.api import InferenceClient
from coreserve.backend.responder import Responder
from coreserve.ensemble._flows import Flows
from coreserve.ensemble._graph import EnsembleGraph, Step
from coreserve.ensemble._sequence_marks import SequenceMark, step_mark
from coreserve.ensemble._step_limits import StepLimits
from coreserve.errors import CancelledError, CoreserveError, InternalError
from coreserve.types import ComputeSums, InferenceRequest

logger = logging.getLogger(__name__)

Tensors = dict[str, np.ndarray | None]  # None: absent (left out by the request, or by a step)
Marks = dict[str, SequenceMark]  # the sequence marks of the tensors steps produced
Answer = tuple[dict[str, np.ndarray], SequenceMark | None]  # a response's outputs, and their mark
StepTask = asyncio.Task[tuple[Tensors, SequenceMark]]
DEFAULT_INFLIGHT = 1024  # ensemble requests at once (each step's own limit is max_inflight_requests)


class EnsembleInstance:
    """Executes ensemble requests; many at once, since it only waits on the composing models."""

    def __init__(
        self, graph: EnsembleGraph, client: InferenceClient, decoupled: bool, inflight: int = 0
    ) -> None:
        self._graph = graph
        self._client = client
        self._decoupled = decoupled
        self._limits = StepLimits(graph.name, len(graph.steps), inflight)
        self.concurrency = DEFAULT_INFLIGHT

    async def execute(self, requests: Sequence[InferenceRequest], responder: Responder) -> None:
        await asyncio.gather(*(self._serve(request, responder) for request in requests))

    async def close(self) -> None:
        return None

    async def _serve(self, request: InferenceRequest, responder: Responder) -> None:
        answered = False
        request.compute_sums = ComputeSums()  # its steps add their compute times here
        flows: Flows[Answer] = Flows()
        forget = request.on_cancel(lambda: flows.fail(self._cancelled()))
        try:
            tensors: Tensors = {name: None for name in self._graph.inputs} | dict(request.inputs)
            flows.start(
                self._flow(flows, request, tensors, {}, self._graph.pruned_steps(request.requested_outputs))
            )
            async with contextlib.aclosing(flows.results()) as results:
                async for (outputs, mark), drained in results:
                    # As Triton's: the final flag rides on the response that finds the pipeline drained.
                    final = drained or not self._decoupled
                    parameters = mark.parameters() if mark is not None else None
                    responder.send(request, outputs, parameters=parameters, final=final)
                    answered = True
                    if final:
                        return
        except CoreserveError as exc:
            responder.send_error(request, exc)
            return
        finally:
            forget()
        if self._decoupled:
            responder.send_final(request)
        elif not answered:
            responder.send_error(
                request, InternalError(f"ensemble '{self._graph.name}' produced no response")
            )

    def _cancelled(self) -> CancelledError:
        return CancelledError(f"request for ensemble '{self._graph.name}' was cancelled")

    async def _flow(
        self,
        flows: Flows[Answer],
        request: InferenceRequest,
        tensors: Tensors,
        marks: Marks,
        done: frozenset[int],
        sent: asyncio.Event | None = None,
    ) -> None:
        """Runs every step it can (those `done` are finished or pruned), then streams the
        decoupled step it reached, or emits the ensemble's outputs if it has those the request
        asks for. `sent`, where given, is set once the first steps it sends have their slots
        (a decoupled one's included), or once it ends without sending any."""
        try:
            finished, deferred = await self._run_steps(request, tensors, marks, done, sent)
            if deferred:
                step = deferred[0]
                done = frozenset(finished | {step.index})
                await self._fan_out(flows, request, step, tensors, marks, done, sent)
                return
        finally:
            if sent is not None:
                sent.set()
        wanted = self._graph.wanted_outputs(request.requested_outputs)
        if all(name in tensors for name in wanted):
            bridges = self._graph.output_bridges
            answer = {name: tensor for name in wanted if (tensor := tensors[name]) is not None}
            for name in wanted:
                if name not in answer:  # (Triton's words, at --log-verbose=1)
                    logger.debug("Composing models did not output tensor %s", name)
            flows.emit((
                {name: bridges[name].fit(t) if name in bridges else t for name, t in answer.items()},
                next((marks[name] for name in answer if name in marks), None),
            ))  # fmt: skip

    async def _run_steps(
        self,
        request: InferenceRequest,
        tensors: Tensors,
        marks: Marks,
        done: frozenset[int],
        sent: asyncio.Event | None,
    ) -> tuple[set[int], list[Step]]:
        """Runs the steps that are not decoupled as their inputs come (adding their outputs to
        `tensors` and `marks`); returns the steps finished, and the decoupled ones reached."""
        finished = set(done)
        running: dict[StepTask, Step] = {}
        deferred: list[Step] = []  # decoupled steps: they fork the flow, so they go last
        try:
            while True:
                if request.is_cancelled():  # no further step starts; those running were cancelled
                    raise self._cancelled()
                for step in self._ready(tensors, finished, running, deferred):
                    if step.index in self._graph.decoupled_steps:
                        deferred.append(step)
                        continue
                    await self._limits.acquire(step.index)
                    task = asyncio.create_task(self._call(request, step, tensors, marks))
                    self._limits.release_when_done(task, step.index)
                    running[task] = step
                if not running:
                    return finished, deferred
                if sent is not None:
                    sent.set()
                completed, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in completed:
                    step = running.pop(task)
                    outputs, mark = task.result()
                    tensors.update(outputs)
                    marks.update(dict.fromkeys(outputs, mark))
                    finished.add(step.index)
        finally:
            for task in running:
                task.cancel()

    async def _fan_out(
        self,
        flows: Flows[Answer],
        request: InferenceRequest,
        step: Step,
        tensors: Tensors,
        marks: Marks,
        done: frozenset[int],
        sent: asyncio.Event | None,
    ) -> None:
        """Streams a decoupled step: each of its responses starts a flow of its own at once,
        but the one that carries the final flag, which goes on in this flow (the stream has
        ended: the flow that finishes last finds the pipeline drained). Under
        `max_inflight_requests` the next response is taken once the previous one's flow has
        sent its first steps: the steps after a fast producer take its responses as their
        slots free (the producer itself is not paused: its responses wait in its stream)."""
        await self._limits.acquire(step.index)
        if sent is not None:
            sent.set()
        last: tuple[Tensors, Marks] | None = None
        try:
            async with contextlib.aclosing(self._stream(request, step, tensors, marks)) as responses:
                async for outputs, mark, final in responses:
                    streamed = ({**tensors, **outputs}, {**marks, **dict.fromkeys(outputs, mark)})
                    if final:
                        last = streamed
                        break
                    next_sent = asyncio.Event() if self._limits.enabled else None
                    flows.start(self._flow(flows, request, *streamed, done, next_sent))
                    if next_sent is not None:
                        await next_sent.wait()
        finally:
            self._limits.release(step.index)  # (Triton's: at the step's final flag)
        if last is not None:
            await self._flow(flows, request, *last, done)

    def _ready(
        self,
        tensors: Tensors,
        finished: set[int],
        running: dict[StepTask, Step],
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

    def _step_request(
        self, request: InferenceRequest, step: Step, tensors: Tensors, marks: Marks
    ) -> tuple[InferenceRequest, SequenceMark]:
        """The step's request, with the sequence mark it runs under (its inputs')."""
        ensemble = SequenceMark.of_request(request.parameters)
        mark = step_mark(
            ensemble, (marks.get(step.inputs[name]) for name in sorted(step.inputs)), step.model_name
        )
        parameters = dict(request.parameters) if mark == ensemble else request.parameters | mark.parameters()
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
            parameters=parameters,
            requested_outputs=tuple(step.outputs),
            traffic_key=request.traffic_key,  # a step that names no version lands where its key says
            counts_into=request.compute_sums,
        )
        child.trace_as_child_of(request)  # a traced ensemble traces its steps as its children
        return child, mark

    def _failed(self, error: CoreserveError) -> CoreserveError:
        """A step's error as the ensemble's, in Triton's words (the step's message names its model)."""
        return type(error)(f"in ensemble '{self._graph.name}', {error.message}")

    def _renamed(self, step: Step, outputs: dict[str, np.ndarray]) -> Tensors:
        """The step's outputs as the ensemble's tensors; one it did not produce is absent."""
        return {tensor: outputs.get(output) for output, tensor in step.outputs.items()}

    async def _call(
        self, request: InferenceRequest, step: Step, tensors: Tensors, marks: Marks
    ) -> tuple[Tensors, SequenceMark]:
        child, mark = self._step_request(request, step, tensors, marks)
        forget = request.on_cancel(child.cancel)  # cancelling the ensemble's request cancels its steps
        try:
            response = await self._client.infer(child)
            return self._renamed(step, dict(response.outputs)), mark.after(response.parameters)
        except CoreserveError as exc:
            raise self._failed(exc) from None
        finally:
            forget()

    async def _stream(
        self, request: InferenceRequest, step: Step, tensors: Tensors, marks: Marks
    ) -> AsyncGenerator[tuple[Tensors, SequenceMark, bool], None]:
        """The decoupled step's responses, each with whether it carried the final flag."""
        child, mark = self._step_request(request, step, tensors, marks)
        forget = request.on_cancel(child.cancel)
        try:
            async for response, final in self._client.stream_with_flags(child):
                if response is None:  # a final flag sent alone
                    return
                if response.error is not None:  # (as Triton: any error of a step fails the ensemble)
                    raise response.error
                yield self._renamed(step, dict(response.outputs)), mark.after(response.parameters), final
        except CoreserveError as exc:
            raise self._failed(exc) from None
        finally:
            forget()
