"""How a model instance answers the requests of one batch."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import numpy as np

from coreserve.config.signature import ModelSignature
from coreserve.errors import CancelledError, CoreserveError, InternalError
from coreserve.types import InferenceRequest, InferenceResponse, ParameterValue, now_ns

logger = logging.getLogger(__name__)


class Responder:
    """Delivers responses to the requests of one batch. Use it on the event loop thread.

    An ordinary model calls `send` once per request; a decoupled model may call it many
    times with `final=False` and then once with `final=True` (outputs may be empty then).
    `send_error` ends a request with an error. The core keeps only the outputs each request
    asked for, so a backend may compute the union for the whole batch. `reschedule` hands a
    request back to be executed again instead (Triton's RESCHEDULE release); `defer` lets an
    ordinary model answer a request after its execution returned.

    Backends that time their phases call `mark_inputs_ready` and `mark_infer_done`; the
    statistics take compute-input, compute-infer and compute-output from these marks.
    """

    __slots__ = (
        "_deferred",
        "_failed",
        "_open",
        "_requeued",
        "_rescheduled",
        "_withdrawn",
        "compute_start_ns",
        "infer_done_ns",
        "inputs_ready_ns",
        "model_version",
        "requests",
        "signature",
    )

    def __init__(
        self, signature: ModelSignature, model_version: str, requests: Sequence[InferenceRequest]
    ) -> None:
        self.signature = signature
        self.model_version = model_version
        self.requests = requests
        self._open = {id(request) for request in requests}
        self._failed: set[int] = set()
        self._deferred: set[int] = set()
        self._rescheduled: list[InferenceRequest] = []
        self._requeued: list[tuple[InferenceRequest, CoreserveError]] = []
        self._withdrawn = 0
        self.compute_start_ns = now_ns()
        self.inputs_ready_ns = 0
        self.infer_done_ns = 0

    def mark_inputs_ready(self) -> None:
        self.inputs_ready_ns = now_ns()

    def mark_infer_done(self) -> None:
        self.infer_done_ns = now_ns()

    def failed(self, request: InferenceRequest) -> bool:
        """True if the request was ended with an error."""
        return id(request) in self._failed

    def is_open(self, request: InferenceRequest) -> bool:
        """True while the request has not had its final response or an error."""
        return id(request) in self._open

    def defer(self, request: InferenceRequest) -> None:
        """An ordinary model answers this open request after its execution returned (a Python
        model's response sender, as Triton allows one response with the final flag): the
        execution does not fail it for want of an answer, and it counts once answered, as a
        decoupled model's request does."""
        if id(request) in self._open:
            self._deferred.add(id(request))

    def deferred(self, request: InferenceRequest) -> bool:
        """True if the request is answered after the execution returned (see `defer`)."""
        return id(request) in self._deferred

    @property
    def rescheduled(self) -> Sequence[InferenceRequest]:
        """The requests handed back with `reschedule`, in the order they were."""
        return self._rescheduled

    def reschedule(self, request: InferenceRequest) -> None:
        """Hands an open request back to its scheduler, to be executed again in a later batch.

        This is Triton's `TRITONSERVER_REQUEST_RELEASE_RESCHEDULE`: the request is not answered
        now (a decoupled model may have sent it non-final responses). Only iterative sequences
        (`sequence_batching { iterative_sequence: true }`) take requests back; under any other
        scheduler the request fails with Triton's error once the execution ends.
        """
        key = id(request)
        if key not in self._open:
            raise InternalError(f"request '{request.id}' was already answered; it cannot be rescheduled")
        self._open.discard(key)
        self._rescheduled.append(request)

    @property
    def requeued(self) -> Sequence[tuple[InferenceRequest, CoreserveError]]:
        """The requests handed back with `requeue`, in the order they were, each with its error."""
        return self._requeued

    def requeue(self, request: InferenceRequest, error: CoreserveError) -> None:
        """Hands back an open request that the instance never started, to be queued again.

        For an instance whose worker process died before it got to the request (it waited
        there behind the batch that was running): the scheduler puts it back at the head of
        its queue, in its place by age, for any instance, and the model never knows. A
        scheduler that cannot take it back (the sequence batcher: a sequence's state lived
        in the dead process) fails it with `error`. A request the model may have seen must
        not be requeued: it would run twice.
        """
        key = id(request)
        if key not in self._open:
            raise InternalError(f"request '{request.id}' was already answered; it cannot be queued again")
        self._open.discard(key)
        self._requeued.append((request, error))

    @property
    def requeued_all(self) -> bool:
        """True when every request of the batch was handed back unstarted: no execution."""
        return len(self._requeued) == len(self.requests)

    @property
    def withdrew_all(self) -> bool:
        """True when every request of the batch was withdrawn: the model never ran it."""
        return self._withdrawn == len(self.requests)

    def withdraw(self, request: InferenceRequest) -> None:
        """Ends an open request that was cancelled before the model got it (it waited in a
        worker process behind other batches): it fails as cancelled, as one that left the
        queue does, and a batch whose requests were all withdrawn counts as no execution."""
        if id(request) not in self._open:
            return
        self._withdrawn += 1
        self.send_error(request, CancelledError.of_request(request.model_name))

    def send(
        self,
        request: InferenceRequest,
        outputs: Mapping[str, np.ndarray],
        *,
        parameters: Mapping[str, ParameterValue] | None = None,
        final: bool = True,
    ) -> None:
        key = id(request)
        if key not in self._open:
            raise InternalError(f"request '{request.id}' was already answered")
        # As Triton: the outputs asked for (one the model did not produce is left out), else
        # those of the model's configuration (implicit state included, for the sequence batcher).
        requested = request.requested_outputs
        known = self.signature.model_outputs
        if requested is not None:
            outputs = {name: outputs[name] for name in requested if name in outputs}
        elif not outputs.keys() <= known.keys():
            outputs = {name: array for name, array in outputs.items() if name in known}
        response = InferenceResponse(
            model_name=request.model_name,
            model_version=self.model_version,
            outputs=self.signature.restore_output_shapes(outputs),
            id=request.id,
            parameters=dict(parameters) if parameters else {},
        )
        if final:
            self._open.discard(key)
        assert request.sink is not None
        request.sink.send(response, final)

    def send_final(self, request: InferenceRequest) -> None:
        """Closes a decoupled request's stream without a further response."""
        key = id(request)
        if key in self._open:
            self._open.discard(key)
            assert request.sink is not None
            request.sink.send(None, True)

    def send_error(self, request: InferenceRequest, error: BaseException, *, final: bool = True) -> None:
        """Ends the request with `error`; `final=False` (a decoupled model's): sends the error as
        one of its responses, and the request stays open for more (Triton's error response
        without the final flag; the request still counts as a success once it ends)."""
        key = id(request)
        if key not in self._open:
            return
        if not isinstance(error, CoreserveError):
            error = InternalError(f"{type(error).__name__}: {error}")
        if not final:
            assert request.sink is not None
            response = InferenceResponse(request.model_name, self.model_version, {}, request.id, error=error)
            request.sink.send(response, False)
            return
        self._open.discard(key)
        self._failed.add(key)
        assert request.sink is not None
        request.sink.fail(error)

    def fail_open_requests(self, error: BaseException, *, deferred: bool = True) -> int:
        """Ends every request that is still open with `error` (`deferred=False`: not those a
        model answers after its execution, see `defer`); returns how many there were."""
        failed = 0
        for request in self.requests:
            key = id(request)
            if key in self._open and (deferred or key not in self._deferred):
                self.send_error(request, error)
                failed += 1
        return failed
