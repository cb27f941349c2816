"""The stub's requests to the server on the model's behalf: BLS calls, metrics, model management.

The stub (`_stub.Stub`) owns one `ServerRequests` and installs it as pb_utils' runtime: it sends
the model's requests and waits for their answers, which the thread that reads the socket hands
to it (`deliver`) for the `BlsCall` of their call id.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import itertools
import queue
import threading
from collections.abc import Callable
from typing import Any, Protocol

from coreserve_python import pb_utils
from coreserve_python.ipc import (
    BlsCancelMessage,
    BlsRequestMessage,
    Channel,
    LogMessage,
    Message,
    SegmentPool,
    SegmentReader,
    segment_to_release,
)

# The keys of the batch whose execute() runs in this context: the BLS calls it makes are its
# children (cancelled with it). A context variable, so that each concurrent `async def execute`
# of a decoupled model has its own.
executing_keys: contextvars.ContextVar[tuple[int, ...]] = contextvars.ContextVar("executing", default=())


class BlsCall:
    """The messages answering one request of the model (a BLS call, a metric, a model load),
    delivered by the reader thread; read blocking, or awaited on an event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._messages: queue.SimpleQueue[Message | None] = queue.SimpleQueue()
        self._loop = loop
        self._arrived = asyncio.Event() if loop is not None else None
        self._lock = threading.Lock()  # (the reader thread delivers, the model's abandons)
        self._discard: Callable[[Message | None], None] | None = None

    def deliver(self, message: Message | None) -> None:
        with self._lock:
            discard = self._discard
            if discard is None:
                self._messages.put(message)
        if discard is not None:
            discard(message)
            return
        if self._loop is not None and self._arrived is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody awaits any more
                self._loop.call_soon_threadsafe(self._arrived.set)

    def abandon(self, discard: Callable[[Message | None], None]) -> None:
        """Nobody reads the rest: the messages waiting, and those still to come, go to `discard`."""
        waiting = []
        with self._lock:
            self._discard = discard
            while not self._messages.empty():
                waiting.append(self._messages.get_nowait())
        for message in waiting:
            discard(message)

    def next(self) -> Message | None:
        return self._messages.get()

    async def next_async(self) -> Message | None:
        assert self._arrived is not None
        while True:
            self._arrived.clear()
            try:
                return self._messages.get_nowait()
            except queue.Empty:
                await self._arrived.wait()


class BlsStream:
    """The responses of a decoupled BLS call, for `pb_utils.ResponseIterator`."""

    def __init__(self, stub: ServerRequests, call_id: int, call: BlsCall) -> None:
        self._stub = stub
        self._call_id = call_id
        self._call = call
        self._ended = False
        self._first: pb_utils.InferenceResponse | None = None  # taken by `wait_first`

    def _convert(self, message: Message | None) -> pb_utils.InferenceResponse | None:
        response, final = self._stub._bls_response(message)
        if final:
            self._ended = True
            self._stub._calls.pop(self._call_id, None)
        return response or pb_utils.InferenceResponse()  # (a final flag sent alone: Triton's empty one)

    async def wait_first(self) -> None:
        """Waits for the first response (`await async_exec(decoupled=True)` does, as Triton's)."""
        self._first = self._convert(await self._call.next_async())

    def next(self) -> pb_utils.InferenceResponse | None:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        return None if self._ended else self._convert(self._call.next())

    async def next_async(self) -> pb_utils.InferenceResponse | None:
        if self._first is not None:
            return self.next()
        return None if self._ended else self._convert(await self._call.next_async())

    def cancel(self) -> None:
        if not self._ended:
            cancel: BlsCancelMessage = {"op": "bls_cancel", "call": self._call_id}
            self._stub._channel.send(cancel)

    def __del__(self) -> None:
        # Left before its final response (a `break`, with or without cancel()): what is still
        # due is let go as it comes, its segments given back to the server, and the call forgotten.
        if not self._ended:
            self._ended = True
            with contextlib.suppress(OSError):  # (the server went away: nothing to give back)
                self._call.abandon(functools.partial(self._stub.discard, self._call_id))


class ServerRequests:
    """Sends the model's requests to the server and waits for their answers: pb_utils' runtime
    (`coreserve_python.pb_utils.runtime.Runtime`) and calls (`_inference.StubCalls`) in a stub."""

    def __init__(
        self,
        channel: Channel,
        pool: SegmentPool,
        reader: SegmentReader,
        wake: Callable[[], None],
        send_response: Callable[[int, pb_utils.InferenceResponse | None, int], None],
    ) -> None:
        """`pool` and `reader`: the stub's segments; `wake`: tells the stub's reader of the socket
        that the model waits for an answer (`Inbox.wake`); `send_response`: the stub's, for
        response senders."""
        self._channel = channel
        self._pool = pool
        self._reader = reader
        self._wake = wake
        self._send_response = send_response
        self._calls: dict[int, BlsCall] = {}
        # Calls a forked child of the model made through this stub (see `_forked`): each call id
        # of ours, with its child's relay and the child's own id for it.
        self._relayed: dict[int, tuple[Relayed, int]] = {}
        self._call_ids = itertools.count()
        self._instance_name = ""
        self._model_dir = ""
        # Between the model's initialize() and its finalize(): BLS calls are taken (Triton's rule).
        self.serving = False

    def serve_model(self, instance_name: str, model_dir: str) -> None:
        """The model the stub serves (its `init`): named in failures, its folder in get_model_dir()."""
        self._instance_name = instance_name
        self._model_dir = model_dir

    def deliver(self, message: Message) -> None:
        """An answer of the server (`bls_response`, `reply`), for the call it names."""
        call = self._calls.get(message["call"])
        if call is not None:
            call.deliver(message)
        elif (relayed := self._relayed.get(message["call"])) is not None:
            relay, child_call = relayed
            if message.get("final", True):
                del self._relayed[message["call"]]
            relay.answer(message["call"], child_call, message)
        else:  # (a call nobody waits for any more)
            self.discard(message["call"], message)

    def relay_call(self, relay: Relayed, child_call: int) -> int:
        """A call a forked child makes through this stub: the call id it goes under."""
        call_id = next(self._call_ids)
        self._relayed[call_id] = (relay, child_call)
        self._wake()  # someone must read the answers (this process may have made no call of its own)
        return call_id

    def send(self, message: Message) -> None:
        """Sends a message of a forked child's on to the server."""
        self._channel.send(message)

    def for_child(self, channel: Channel, pool: SegmentPool, wake: Callable[[], None]) -> ServerRequests:
        """The requests of a process forked from this stub's, made on its own `channel`."""
        child = ServerRequests(channel, pool, self._reader, wake, _no_response_from_a_child)
        child.serve_model(self._instance_name, self._model_dir)
        child.serving = self.serving
        return child

    def discard(self, call_id: int, message: Message | None) -> None:
        """A message of a call nobody reads: its segment goes back to the server; the last one
        ends the call."""
        if message is not None and (shared := segment_to_release(message.get("segment"))) is not None:
            self._channel.send({"op": "release", "segments": [shared]})
        if message is None or message.get("final", True):
            self._calls.pop(call_id, None)

    def server_gone(self) -> None:
        """The server closed its end: whoever waits for an answer from it gets none."""
        for call in list(self._calls.values()):
            call.deliver(None)

    def send_response(self, key: int, response: pb_utils.InferenceResponse | None, flags: int) -> None:
        self._send_response(key, response, flags)

    def log(self, level: str, message: str, source: str) -> None:
        line: LogMessage = {"op": "log", "level": level, "message": message, "source": source}
        self._channel.send(line)

    def ask(self, op: str, fields: dict[str, Any], what: str) -> Any:
        """Sends a request to the server and waits for its `reply` (matched by call id)."""
        call = BlsCall()
        call_id = next(self._call_ids)
        self._calls[call_id] = call
        try:
            self._channel.send({"op": op, "call": call_id, **fields})
            self._wake()
            reply = call.next()
        finally:
            self._calls.pop(call_id, None)
        if reply is None:
            raise pb_utils.TritonModelException(self.failure(what, "the server went away"))
        if reply["error"] is not None:
            raise pb_utils.TritonModelException(self.failure(what, reply["error"]))
        return reply["result"]

    def tell(self, op: str, fields: dict[str, Any]) -> None:
        self._channel.send({"op": op, **fields})

    def failure(self, what: str, reason: str) -> str:
        return f"{what}: Failed to process the request for model '{self._instance_name}', message: {reason}"

    def model_dir(self) -> str:
        return self._model_dir

    def free_shared_memory(self) -> int:
        return self._pool.free_bytes()

    def _send_bls(self, request: pb_utils.InferenceRequest, decoupled: bool, call: BlsCall) -> int:
        call_id = next(self._call_ids)
        self._calls[call_id] = call
        inputs = [(tensor.name(), tensor._host_array()) for tensor in request.inputs()]
        segment, refs = self._pool.write(inputs)
        version = request.model_version()
        message: BlsRequestMessage = {
            "op": "bls_request",
            "call": call_id,
            "model": request.model_name(),
            "version": str(version) if version >= 0 else "",
            "inputs": refs,
            "segment": segment,
            "requested": request._requested,
            "parameters": request._parameters,
            "id": request.request_id(),
            "correlation_id": request.correlation_id(),
            "flags": request.flags(),
            "timeout": request.timeout(),
            "decoupled": decoupled,
            # Made by an execute() of this stub: a child of the batch being executed.
            "parents": list(executing_keys.get()),
            "trace_parent": request.trace()._request_key,
        }
        self._channel.send(message)
        self._wake()  # the model waits for the answers: the socket must be read
        return call_id

    def _bls_response(self, message: Message | None) -> tuple[pb_utils.InferenceResponse | None, bool]:
        """Turns a bls_response message into (response, final); None message: the server went away."""
        if message is None:
            error = pb_utils.TritonError(
                "the server went away during a BLS request", pb_utils.TritonError.UNAVAILABLE
            )
            return pb_utils.InferenceResponse(error=error), True
        if message["error"] is not None:
            text, code = message["error"]
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(text, code)), True
        body = message["response"]
        response = None
        if body is not None:
            arrays = self._reader.arrays(message["segment"], body["outputs"], copy=True)
            if (shared := segment_to_release(message["segment"])) is not None:
                self._channel.send({"op": "release", "segments": [shared]})
            outputs = [pb_utils.Tensor(name, array) for name, array in arrays.items()]
            response = pb_utils.InferenceResponse(outputs, parameters=body["parameters"])
        return response, message["final"]

    def _check_bls(self) -> None:
        if not self.serving:
            raise pb_utils.TritonModelException("BLS is only supported during the 'execute' function.")

    def execute_bls(self, request: pb_utils.InferenceRequest) -> pb_utils.InferenceResponse:
        self._check_bls()
        call = BlsCall()
        call_id = self._send_bls(request, False, call)
        try:
            response, _ = self._bls_response(call.next())
        finally:
            self._calls.pop(call_id, None)
        return response or pb_utils.InferenceResponse()

    def stream_bls(
        self, request: pb_utils.InferenceRequest
    ) -> pb_utils.ResponseIterator[pb_utils.InferenceResponse]:
        self._check_bls()
        call = BlsCall()
        return pb_utils.ResponseIterator(BlsStream(self, self._send_bls(request, True, call), call))

    def async_bls(self, request: pb_utils.InferenceRequest, decoupled: bool) -> asyncio.Future[Any]:
        """Sends a BLS request now; a future of its response (decoupled: of its iterator)."""
        self._check_bls()
        loop = asyncio.get_running_loop()  # RuntimeError outside a coroutine, as on Triton
        call = BlsCall(loop)
        call_id = self._send_bls(request, decoupled, call)
        if decoupled:
            stream = BlsStream(self, call_id, call)  # (made now: cancelled unstarted, it still lets go)

            async def first_response() -> pb_utils.ResponseIterator[pb_utils.InferenceResponse]:
                await stream.wait_first()
                return pb_utils.ResponseIterator(stream)

            return asyncio.ensure_future(first_response())

        async def response() -> pb_utils.InferenceResponse:
            try:
                answer, _ = self._bls_response(await call.next_async())
            finally:
                self._calls.pop(call_id, None)
            return answer or pb_utils.InferenceResponse()

        return asyncio.ensure_future(response())


class Relayed(Protocol):
    """Where the answers to a forked child's calls go (`_forked.Relay`)."""

    def answer(self, call_id: int, child_call: int, message: Message) -> None:
        """Passes the answer to call `call_id` on to the child, under its own id for it (or lets
        it go, `ServerRequests.discard`, where the child has gone); never waits for the child."""
        ...


def _no_response_from_a_child(key: int, response: pb_utils.InferenceResponse | None, flags: int) -> None:
    raise pb_utils.TritonModelException(
        "a response sender sends only from the model's own process, not from a process it forked"
    )


async def in_context(coroutine: Any, keys: tuple[int, ...]) -> Any:
    """Runs a coroutine of execute() with its batch's keys in its context (see `executing_keys`)."""
    executing_keys.set(keys)
    return await coroutine
