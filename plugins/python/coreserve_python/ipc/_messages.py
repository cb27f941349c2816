"""The messages between the server and a stub, one TypedDict each: the protocol, in one place.

Every message is a dict with an `op`; on the socket it is pickled (see `_channel.Channel`), so these
types cost nothing at run time: they let mypy check each message where it is built.

Requests that wait for an answer carry an id, and the answer names it:

- server -> stub: `init`, `execute`, `finalize` (and `auto_complete`, in a one-shot stub) carry
  `id`; the stub answers `init_done`, `execute_done`, `finalize_done`, `auto_complete_done`
  with `reply_to` = that id.
- stub -> server: `bls_request` and the model's requests (`metric_family`, `metric`,
  `metric_value`, `load_model`, `unload_model`, `model_ready`) carry `call`; the server answers
  `bls_response` (one or more) or `reply` with the same `call`.

Messages that need no answer: `cancel` (a request given to the model was cancelled),
`bls_cancel` (the model cancels a decoupled BLS call), `release` (segments the reader is done
with), `responses` (a model's responses outside an execution), `log`, `metric_update`,
`metric_delete` and `metric_family_delete` (the model let go of a metric or a family).
Tensors travel in shared memory segments, or inline when small (a message's `segment` is a
`Blob`, see `_segments`); a message lists them as `TensorRef`s. Beside the messages, the stub marks which
execution it has started in shared memory that `init` names (see `_start_mark`).
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

# Any message, as the channel carries it: a dict with an `op`.
Message = dict[str, Any]
# name, datatype, shape, offset, size: where one tensor lies in a segment (see _segments.py).
TensorRef = tuple[str, str, tuple[int, ...], int, int]
# A segment's name, the tensors' bytes inline, or None (no tensor data): see _segments.py.
Blob = str | bytearray | None
# A response's error: its text and its pb_utils.TritonError code.
ErrorTuple = tuple[str, int]
# The bits of a request's `flags` (pb_utils' TRITONSERVER_REQUEST_FLAG_SEQUENCE_*).
SEQUENCE_START, SEQUENCE_END = 1, 2

# Server -> stub.


class InitMessage(TypedDict):
    op: Literal["init"]
    id: NotRequired[int]
    model_file: str
    backend_based: NotRequired[bool]  # model_file is a Python-based backend's, not the model's own
    args: dict[str, str]
    decoupled: bool
    idle_spin_microseconds: int
    start_mark: NotRequired[str]  # the file the stub marks each execution's start in (_start_mark.py)


class AutoCompleteMessage(TypedDict):
    op: Literal["auto_complete"]
    id: NotRequired[int]
    model_file: str
    backend_based: NotRequired[bool]
    config: dict[str, Any]


class RequestItem(TypedDict):
    """One request of an `execute` message."""

    key: int  # the server's handle of the request, in responses and cancellations
    id: str
    inputs: list[TensorRef]
    requested: list[str]
    parameters: dict[str, Any]
    correlation_id: int | str
    flags: int
    cancelled: NotRequired[bool]
    timeout: NotRequired[int]  # the request's `timeout` parameter (microseconds), where it has one


class ExecuteMessage(TypedDict):
    op: Literal["execute"]
    id: NotRequired[int]
    model_name: str
    segment: Blob
    requests: list[RequestItem]


class FinalizeMessage(TypedDict):
    op: Literal["finalize"]
    id: NotRequired[int]


class CancelMessage(TypedDict):
    op: Literal["cancel"]
    key: int


class BlsResponseBody(TypedDict):
    outputs: list[TensorRef]
    parameters: dict[str, Any]


class BlsResponseMessage(TypedDict):
    op: Literal["bls_response"]
    call: int
    error: ErrorTuple | None
    response: BlsResponseBody | None  # None with `final`: the end of a decoupled call
    segment: Blob
    final: bool


class ReplyMessage(TypedDict):
    op: Literal["reply"]
    call: int
    result: Any
    error: str | None


class ReleaseMessage(TypedDict):
    op: Literal["release"]
    segments: list[str]


# Stub -> server.


class InitDoneMessage(TypedDict):
    op: Literal["init_done"]
    reply_to: int | None
    error: str | None


class AutoCompleteDoneMessage(TypedDict):
    op: Literal["auto_complete_done"]
    reply_to: int | None
    config: dict[str, Any] | None
    error: str | None


class ResponseBody(TypedDict):
    outputs: list[TensorRef]
    error: ErrorTuple | None
    parameters: dict[str, Any]


class ResponsesMessage(TypedDict):
    """Responses of requests given to the model: (key, body or None for a bare final, final)."""

    op: Literal["responses"]
    segment: Blob
    items: list[tuple[int, ResponseBody | None, bool]]


class ExecuteDoneMessage(TypedDict):
    op: Literal["execute_done"]
    reply_to: int | None
    started_ns: int  # when the model started on it (time.monotonic_ns, the server's clock too)
    error: str | None
    responses: ResponsesMessage | None  # an ordinary model's responses travel with the end
    release: list[str]
    rescheduled: list[int]  # keys of requests handed back (RESCHEDULE), to be executed again
    withdrawn: list[int]  # keys of requests cancelled before the model got them (not run)
    deferred: list[int]  # keys an ordinary model answers with its response sender, after this
    infer_ns: list[int] | None  # when the model's execute started and returned (None: it raised)


class FinalizeDoneMessage(TypedDict):
    op: Literal["finalize_done"]
    reply_to: int | None
    error: str | None


class BlsRequestMessage(TypedDict):
    op: Literal["bls_request"]
    call: int
    model: str
    version: str
    inputs: list[TensorRef]
    segment: Blob
    requested: list[str]
    parameters: dict[str, Any]
    id: str
    correlation_id: int | str
    flags: int
    timeout: int  # microseconds; 0: none
    decoupled: bool
    parents: list[int]  # the keys of the batch whose execute() made the call
    trace_parent: int | None  # the key of the request whose trace() the call was given


class BlsCancelMessage(TypedDict):
    op: Literal["bls_cancel"]
    call: int


class LogMessage(TypedDict):
    op: Literal["log"]
    level: str
    message: str
    source: str  # the model's file:line that logs (the server's log names it)
