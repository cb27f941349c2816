"""One traced request: its timestamps and tensors, and where they go once it ends.

A `RequestTrace` exists only for a request that was sampled; every other request carries
None, so the request path's whole cost with tracing off is a check for None. The marks
are the ones the statistics already take (received, queued, compute start, inputs ready,
infer done, end); a trace reads them, it takes no second set.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from coreserve.responses import ForwardingSink
from coreserve.types import (
    DataType,
    InferenceRequest,
    InferenceResponse,
    ResponseSink,
    Trace,
    TraceContext,
    now_ns,
)

if TYPE_CHECKING:
    from coreserve.errors import CoreserveError


class TraceRecorder(Protocol):
    """Where finished traces go: Triton's trace file, or OpenTelemetry spans."""

    def record(self, trace: RequestTrace) -> None:
        """Takes a finished trace (on the event loop thread)."""


@dataclass(slots=True)
class TensorRecord:
    activity: str  # TENSOR_QUEUE_INPUT or TENSOR_BACKEND_OUTPUT
    name: str
    data: str
    shape: str
    dtype: str


class RequestTrace:
    """The trace of one request: Triton's named timestamps, in the order they happened."""

    __slots__ = (
        "computing",
        "context",
        "end_pending",
        "finish_pending",
        "id",
        "marks",
        "model_name",
        "model_version",
        "otel",
        "parent",
        "recorder",
        "request_id",
        "tensor_records",
        "tensors",
    )

    def __init__(
        self,
        trace_id: int,
        request: InferenceRequest,
        model_version: int,
        recorder: TraceRecorder,
        *,
        tensors: bool,
        context: TraceContext | None,
    ) -> None:
        self.id = trace_id
        self.model_name = request.model_name
        self.model_version = model_version
        self.request_id = request.id
        self.recorder = recorder
        self.tensors = tensors
        self.context = context
        self.parent = context.parent if context is not None else None
        self.marks: list[tuple[str, int]] = []
        self.tensor_records: list[TensorRecord] = []
        self.otel: Any = None  # the OpenTelemetry spans of this request, in that mode
        # A backend may send a request's last response before its execution ends (the core
        # takes the compute marks after): then the trace is finished once they are taken.
        self.computing = False
        self.finish_pending = False
        self.end_pending = 0
        if context is not None and context.protocol:
            prefix = context.protocol
            first, last = (
                ("WAITREAD_START", "WAITREAD_END") if prefix == "GRPC" else ("RECV_START", "RECV_END")
            )
            self.marks.append((f"{prefix}_{first}", context.recv_start_ns))
            self.marks.append((f"{prefix}_{last}", context.recv_end_ns))
        # The request object is made as its decoding ends, so its mark can precede the frontend's
        # last receive mark by the decoder's last steps; Triton's order is kept.
        received = request.received_ns
        self.marks.append(("REQUEST_START", max(received, self.marks[-1][1]) if self.marks else received))
        if tensors:
            self.add_tensors("TENSOR_QUEUE_INPUT", request.inputs.items())

    def mark(self, name: str, ns: int) -> None:
        self.marks.append((name, ns))

    def request_end(self, ns: int) -> None:
        """Marks REQUEST_END: the request is answered; never before its compute ends (as Triton)."""
        if self.computing:
            self.end_pending = ns
        else:
            self.marks.append(("REQUEST_END", ns))

    def executed(
        self,
        queued_ns: int,
        start_ns: int,
        inputs_ready_ns: int,
        infer_done_ns: int,
        end_ns: int,
        *,
        computed: bool = True,
    ) -> None:
        """Records the queue and compute phases, from the marks the statistics took; an
        ensemble's request (not `computed`: its steps compute) has its queue phase only, as on
        Triton."""
        self.marks.append(("QUEUE_START", queued_ns or start_ns))
        if computed:
            self.marks.append(("COMPUTE_START", start_ns))
            self.marks.append(("COMPUTE_INPUT_END", inputs_ready_ns or start_ns))
            self.marks.append(("COMPUTE_OUTPUT_START", infer_done_ns or end_ns))
            self.marks.append(("COMPUTE_END", end_ns))
        self.computing = False
        if self.end_pending:
            self.marks.append(("REQUEST_END", max(self.end_pending, end_ns)))
        if self.finish_pending:
            self.finish()

    def add_tensors(self, activity: str, tensors: Iterable[tuple[str, np.ndarray]]) -> None:
        for name, array in tensors:
            self.tensor_records.append(_tensor_record(activity, name, array))

    def outputs(self, outputs: Mapping[str, np.ndarray]) -> None:
        if self.tensors:
            self.add_tensors("TENSOR_BACKEND_OUTPUT", outputs.items())

    def finish(self) -> None:
        """Hands the trace to its recorder; call once, when the request has been answered."""
        if self.computing:
            self.finish_pending = True
            return
        recorder, self.recorder = self.recorder, None  # type: ignore[assignment]
        if recorder is not None:
            recorder.record(self)

    def first(self, name: str) -> int | None:
        for mark, ns in self.marks:
            if mark == name:
                return ns
        return None


class TraceEndingSink(ForwardingSink):
    """A traced request's sink that ends its trace with its last response (streams, ModelStreamInfer)."""

    __slots__ = ("_trace",)

    def __init__(self, trace: Trace, target: ResponseSink) -> None:
        super().__init__(target)
        self._trace = trace

    def send(self, response: InferenceResponse | None, final: bool) -> None:
        if response is not None:
            self._trace.outputs(response.outputs)
        self._target.send(response, final)
        if final:
            self._end()

    def fail(self, error: CoreserveError) -> None:
        self._target.fail(error)
        self._end()

    def _end(self) -> None:
        self._trace.request_end(now_ns())
        self._trace.finish()


def _tensor_record(activity: str, name: str, array: np.ndarray) -> TensorRecord:
    try:
        dtype = DataType.from_numpy(array.dtype).value
    except ValueError:
        dtype = str(array.dtype)
    flat = array.reshape(-1)
    if array.dtype == np.object_:
        values = [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in flat]
    elif array.dtype.kind == "f" or dtype == "BF16":
        values = [format(float(v), "g") for v in flat]
    elif array.dtype.kind == "b":
        values = ["1" if v else "0" for v in flat]
    else:
        values = [str(int(v)) for v in flat]
    return TensorRecord(activity, name, ",".join(values), ",".join(str(d) for d in array.shape), dtype)
