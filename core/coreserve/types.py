"""The values that flow through the server: datatypes, inference requests and responses.

Tensors are numpy arrays. BYTES tensors are numpy object arrays of `bytes`; BF16 tensors use
`ml_dtypes.bfloat16`. A request's datatype is therefore implied by its array's dtype, and the
v2 datatype names (`"FP32"`, `"BYTES"` …) appear only at the protocol boundary.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import ml_dtypes
import numpy as np

if TYPE_CHECKING:
    from coreserve.errors import CoreserveError

ParameterValue = bool | int | float | str
logger = logging.getLogger(__name__)


class DataType(enum.StrEnum):
    """A tensor element type, named as the KServe v2 protocol names it."""

    BOOL = "BOOL"
    UINT8 = "UINT8"
    UINT16 = "UINT16"
    UINT32 = "UINT32"
    UINT64 = "UINT64"
    INT8 = "INT8"
    INT16 = "INT16"
    INT32 = "INT32"
    INT64 = "INT64"
    FP16 = "FP16"
    FP32 = "FP32"
    FP64 = "FP64"
    BYTES = "BYTES"
    BF16 = "BF16"

    @property
    def numpy_dtype(self) -> np.dtype[Any]:
        return NUMPY_DTYPES[self]

    @property
    def itemsize(self) -> int | None:
        """Bytes per element, or None for BYTES (variable length)."""
        return None if self is DataType.BYTES else NUMPY_DTYPES[self].itemsize

    @property
    def config_name(self) -> str:
        """The model configuration's name for this type (`TYPE_FP32`, `TYPE_STRING` …)."""
        return "TYPE_STRING" if self is DataType.BYTES else f"TYPE_{self.value}"

    @property
    def config_value(self) -> int:
        """The model configuration's enum number for this type (`inference.DataType`)."""
        return _CONFIG_VALUES[self]

    @classmethod
    def from_config_value(cls, value: int) -> DataType:
        """The datatype for a configuration enum number; raises ValueError for TYPE_INVALID."""
        try:
            return _DATATYPE_BY_CONFIG_VALUE[value]
        except KeyError:
            raise ValueError(f"model configuration data type {value} is not a tensor type") from None

    @classmethod
    def from_config_name(cls, name: str) -> DataType:
        """The datatype for a configuration type name; raises ValueError for unknown names."""
        if name == "TYPE_STRING":
            return cls.BYTES
        if not name.startswith("TYPE_"):
            raise ValueError(f"unknown model configuration data type {name!r}")
        return cls(name[5:])

    @classmethod
    def from_numpy(cls, dtype: np.dtype[Any]) -> DataType:
        """The datatype that a numpy dtype represents; raises ValueError if none does."""
        try:
            return _DATATYPE_BY_NUMPY[np.dtype(dtype)]
        except KeyError:
            if np.dtype(dtype).kind in "SU":
                return cls.BYTES
            raise ValueError(f"numpy dtype {dtype} has no v2 datatype") from None


NUMPY_DTYPES: dict[DataType, np.dtype[Any]] = {
    DataType.BOOL: np.dtype(np.bool_),
    DataType.UINT8: np.dtype(np.uint8),
    DataType.UINT16: np.dtype(np.uint16),
    DataType.UINT32: np.dtype(np.uint32),
    DataType.UINT64: np.dtype(np.uint64),
    DataType.INT8: np.dtype(np.int8),
    DataType.INT16: np.dtype(np.int16),
    DataType.INT32: np.dtype(np.int32),
    DataType.INT64: np.dtype(np.int64),
    DataType.FP16: np.dtype(np.float16),
    DataType.FP32: np.dtype(np.float32),
    DataType.FP64: np.dtype(np.float64),
    DataType.BYTES: np.dtype(np.object_),
    DataType.BF16: np.dtype(ml_dtypes.bfloat16),
}
_DATATYPE_BY_NUMPY = {dtype: datatype for datatype, dtype in NUMPY_DTYPES.items()}
# The numbers of protos/model_config.proto's DataType enum (TYPE_BOOL = 1 … TYPE_BF16 = 14),
# in the order the enum above declares its members; a test checks them against the schema.
_CONFIG_VALUES = {datatype: number for number, datatype in enumerate(DataType, start=1)}
_DATATYPE_BY_CONFIG_VALUE = {number: datatype for datatype, number in _CONFIG_VALUES.items()}


# The request parameters that are a request's own fields in Triton (its sequence, priority and
# queue timeout): the server acts on them; a backend gives them to its model as those fields, not
# among its parameters, and a forwarded header never stands in for one.
REQUEST_FIELDS = frozenset(("sequence_id", "sequence_start", "sequence_end", "priority", "timeout"))


def is_request_field(name: str) -> bool:
    """Whether the request parameter `name` is one of a request's own fields (REQUEST_FIELDS)."""
    return name in REQUEST_FIELDS


def now_ns() -> int:
    """The clock that every timestamp of a request uses."""
    return time.monotonic_ns()


class Trace(Protocol):
    """A sampled request's trace, as the request's handlers use it (`coreserve.tracing` makes them).

    Frontends mark their timestamps and finish it, the schedulers record the execution, and a
    child request's trace reads its parent's `id`, `tensors` and OpenTelemetry spans (`otel`).
    """

    id: int
    tensors: bool
    otel: Any
    computing: bool

    def mark(self, name: str, ns: int) -> None:
        """Records a named timestamp (HTTP_SEND_START …)."""

    def request_end(self, ns: int) -> None:
        """Marks REQUEST_END: the request is answered."""

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
        """Records the queue and compute phases (the queue's only, where not `computed`)."""

    def outputs(self, outputs: Mapping[str, np.ndarray]) -> None:
        """Records a response's output tensors, if the trace keeps tensors."""

    def finish(self) -> None:
        """Hands the trace on; call once, when the request has been answered."""


@dataclass(slots=True)
class TraceContext:
    """What a frontend or a parent request knows of a request before it is sampled.

    `protocol` is "HTTP" or "GRPC" (Triton's timestamp prefixes) or "" for a request made
    in-process; `traceparent` is the client's W3C header; `parent` the trace of the ensemble
    or BLS request that made this one. `sampled` False: a request a model made for an untraced
    request (or without its trace), which is not traced (UNSAMPLED).
    """

    protocol: str = ""
    recv_start_ns: int = 0
    recv_end_ns: int = 0
    traceparent: str | None = None
    parent: Trace | None = None
    sampled: bool = True


UNSAMPLED = TraceContext(sampled=False)


@dataclass(slots=True)
class ComputeSums:
    """Compute times (ns) added up over the requests an ensemble's request made of its steps:
    the ensemble's own compute statistics, as Triton counts them."""

    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0

    def add(self, input_ns: int, infer_ns: int, output_ns: int) -> None:
        self.input_ns += input_ns
        self.infer_ns += infer_ns
        self.output_ns += output_ns


@dataclass(slots=True, eq=False)
class InferenceRequest:
    """One client request for one model, decoded from whatever transport carried it.

    `model_version` is the version the client named ("" for the latest). `requested_outputs`
    is None when the client asked for every output. `batch_size` is the size of the first
    dimension for models that batch, and 1 for models that do not.
    """

    model_name: str
    inputs: dict[str, np.ndarray]
    model_version: str = ""
    id: str = ""
    parameters: dict[str, ParameterValue] = field(default_factory=dict)
    requested_outputs: tuple[str, ...] | None = None
    # Outputs to answer as their top K classes (the classification extension): name -> K.
    class_counts: dict[str, int] | None = None
    batch_size: int = 1
    received_ns: int = field(default_factory=now_ns)
    queued_ns: int = 0
    sink: ResponseSink | None = None
    # Tracing: what a frontend or parent request knows before sampling (set only while some
    # trace setting is on), and the request's trace once it is sampled (None otherwise).
    trace_context: TraceContext | None = None
    trace: Trace | None = None
    # What keeps a request on one version of a model with traffic weights (the HTTP header
    # `coreserve-traffic-key`, or the request parameter `coreserve_traffic_key`); None: drawn.
    traffic_key: str | None = None
    # Whether the traffic step chose its version (the client named none): only such a request
    # is copied to its model's shadow and counted by its model's rollout.
    routed: bool = False
    # An ensemble's request counts its steps' compute times as its own (`compute_sums`, set
    # by the ensemble); the request of one of its steps adds its times there (`counts_into`).
    compute_sums: ComputeSums | None = None
    counts_into: ComputeSums | None = None
    # Cancellation (see `cancel`). The callback list is made by the first `on_cancel`, so a
    # request nobody watches costs one flag; `queue` is set by the scheduler it waits in.
    _cancelled: bool = field(default=False, init=False, repr=False)
    _on_cancel: list[Callable[[], object]] | None = field(default=None, init=False, repr=False)
    queue: RequestQueue | None = field(default=None, init=False, repr=False)

    def trace_as_child_of(self, parent: InferenceRequest | None) -> None:
        """Traces this request as a child of `parent`'s trace, if `parent` is traced.

        For requests a model makes while executing `parent` (ensemble steps, BLS calls): the
        child's trace names the parent's (`parent_id` in Triton's trace file; a child span in
        OpenTelemetry). As in Triton, such a request is traced with its parent or not at all:
        it is not sampled on its own (None: the model did not give its request's trace).
        Call it before submitting this request.
        """
        if parent is not None and parent.trace is not None:
            self.trace_context = TraceContext(parent=parent.trace)
        else:
            self.trace_context = UNSAMPLED

    def made_by_a_model(self) -> bool:
        """True for a request a model made while executing another (an ensemble's step, a BLS
        call): one traced as a child (see `trace_as_child_of`), not a client's."""
        context = self.trace_context
        return context is not None and (not context.sampled or context.parent is not None)

    def is_cancelled(self) -> bool:
        """True once the request was cancelled: its client gave up, or its parent was cancelled.

        Cheap enough to call between every two responses of a decoupled model.
        """
        return self._cancelled

    def cancel(self) -> None:
        """Cancels the request: the frontends call it when the client gives up.

        A request still waiting in a scheduler queue leaves it and fails with CANCELLED (it
        never reaches a backend); a running one is marked, so that its backend can stop early.
        Either way it counts as a failure with reason CANCELED. Then the callbacks registered
        with `on_cancel` run, in order. Only the first call does anything. Call it on the event
        loop thread.
        """
        if self._cancelled:
            return
        self._cancelled = True
        if self.queue is not None:
            self.queue.withdraw(self)
        callbacks, self._on_cancel = self._on_cancel, None
        for callback in callbacks or ():
            try:
                callback()
            except Exception:  # one faulty callback must not keep the others from running
                logger.exception("a cancellation callback of request '%s' failed", self.id)

    def on_cancel(self, callback: Callable[[], object]) -> Callable[[], None]:
        """Calls `callback()` (on the event loop thread) when the request is cancelled.

        :param callback: runs once, at once if the request is cancelled already.
        :return: a function that unregisters the callback; call it once the request is done,
            so that a long-lived request does not gather callbacks.
        """
        if self._cancelled:
            callback()
            return _nothing
        if self._on_cancel is None:
            self._on_cancel = []
        self._on_cancel.append(callback)

        def remove() -> None:
            if self._on_cancel is not None and callback in self._on_cancel:
                self._on_cancel.remove(callback)

        return remove

    async def wait_cancelled(self) -> None:
        """Returns once the request is cancelled (never, if it is not): a backend can race its
        work against it, e.g. with `asyncio.wait(..., return_when=FIRST_COMPLETED)`."""
        if self._cancelled:
            return
        cancelled: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not cancelled.done():
                cancelled.set_result(None)

        remove = self.on_cancel(wake)
        try:
            await cancelled
        finally:
            remove()


def _nothing() -> None:
    return None


class RequestQueue(Protocol):
    """A scheduler queue that may hold a request: told when the request is cancelled."""

    def withdraw(self, request: InferenceRequest) -> None:
        """Removes a cancelled request if it is still queued, and fails it with CANCELLED."""


@dataclass(slots=True, eq=False)
class InferenceResponse:
    """One response to a request: its outputs, keyed by name, in the order they were produced.

    A decoupled model may also send an error without ending the request (Triton's error
    response without the final flag): a response whose `error` is set and has no outputs, and
    more responses may follow it.
    """

    model_name: str
    model_version: str
    outputs: Mapping[str, np.ndarray]
    id: str = ""
    parameters: dict[str, ParameterValue] = field(default_factory=dict)
    error: CoreserveError | None = None


class ResponseSink(Protocol):
    """Receives the responses of one request. Called on the event loop thread only."""

    @property
    def done(self) -> bool:
        """True once the final response or an error was delivered."""
        ...

    def send(self, response: InferenceResponse | None, final: bool) -> None:
        """Delivers a response; `None` with `final=True` only closes the stream."""

    def fail(self, error: CoreserveError) -> None:
        """Ends the request with an error."""
