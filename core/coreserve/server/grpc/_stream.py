"""One `ModelStreamInfer` call: the requests read from it and the messages written to it.

Messages go out in the order they come; the native transport writes one at once where nothing
waits before it, grpc.aio's context cannot, and every message then waits in the outbox for the
call's generator (`messages`). Once `limit` requests are open (read, their last message not yet
sent), the call reads no more until one is answered (HTTP/2 flow control then holds the client
back). A client that reads slowly, or not at all, has at most MAX_WAITING_BYTES of outputs
waiting here: a response past that is refused (`deliver` answers False), never a final one.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from coreserve.config import ModelSignature
from coreserve.errors import CoreserveError
from coreserve.protocol.grpc_response import SerializedPieces
from coreserve.protos import grpc_service_pb2 as pb
from coreserve.responses import MAX_WAITING_BYTES

StreamMessage = bytes | SerializedPieces | pb.ModelStreamInferResponse
# (message, final, output bytes): None as a message only ends a request; None alone: reading ended.
Outbox = asyncio.Queue[tuple[StreamMessage | None, bool, int] | None]


Deliver = Callable[["StreamMessage | None", bool, "Callable[[], int] | None"], bool]
FINAL_RESPONSE = "triton_final_response"  # a response parameter of Triton's streaming protocol
_FAILED = object()  # in the outbox: the call ends here, with `failure` as its status


class StreamCall:
    """The messages of one stream call and its open requests.

    A call whose client asked for Triton's `triton_grpc_error` mode ends at its first error
    (`fail`): the messages before it go out, then the caller ends the call with the error's status.
    """

    def __init__(self, limit: int, send_now: Callable[[Any], bool] | None) -> None:
        """`limit`: the requests open at once (max_stream_inflight); `send_now`: the native
        transport's write of a message at once (False where it cannot), else None."""
        self._outbox: Outbox = asyncio.Queue()
        self._limit = limit
        self._send_now = send_now
        self._open = 0  # read, and their last message not yet sent
        self._waiting_bytes = 0  # the outputs of the messages in the outbox
        self._room = asyncio.Event()
        self._room.set()
        self._reading = True
        self.failure: CoreserveError | None = None

    def deliver(
        self, message: StreamMessage | None, final: bool, measure: Callable[[], int] | None = None
    ) -> bool:
        """Sends or queues a message; False (dropped) for one past the bound, never a final one
        (`measure`: what its outputs hold, counted while it waits)."""
        if self.failure is not None:  # (the call ends: nothing more goes out)
            return True
        send_now = self._send_now
        if send_now is None or not self._outbox.empty() or (message is not None and not send_now(message)):
            size = measure() if measure is not None and not final else 0
            if not final and not self._outbox.empty() and self._waiting_bytes + size > MAX_WAITING_BYTES:
                return False
            self._waiting_bytes += size
            self._outbox.put_nowait((message, final, size))
            return True
        if final:
            self._answered()
            if not (self._reading or self._open):
                self._outbox.put_nowait(None)  # wakes the generator to end the call
        return True

    def fail(self, error: CoreserveError) -> None:
        """Ends the call at this error (the first one only), after the messages queued before it."""
        if self.failure is None:
            self.failure = error
            self._outbox.put_nowait(_FAILED)  # type: ignore[arg-type]

    async def read(self, requests: AsyncIterator[Any], start: Callable[[Any], Awaitable[None]]) -> None:
        """Starts each request read (`start`), waiting for room once `limit` are open."""
        try:
            async for message in requests:
                self._open += 1
                await start(message)
                if self._open >= self._limit:
                    self._room.clear()
                    await self._room.wait()
        finally:  # even on a fault: the writer ends once the open requests are answered
            self._outbox.put_nowait(None)

    async def messages(self) -> AsyncIterator[StreamMessage]:
        """The messages that waited, in order, until reading ended and every request is answered."""
        while self._reading or self._open:
            item = await self._outbox.get()
            if item is _FAILED:
                return
            if item is None:
                self._reading = False
                continue
            message, final, size = item
            self._waiting_bytes -= size
            if message is not None:
                yield message
            if final:
                self._answered()

    def _answered(self) -> None:
        self._open -= 1
        if self._open < self._limit:
            self._room.set()


@dataclass
class _Place:
    """An ordered request's place: its messages held until those before it are answered."""

    held: list[tuple[StreamMessage | None, bool, Callable[[], int] | None]] = field(default_factory=list)
    answered: bool = False  # its final message has come


class InOrder:
    """Triton's order on a stream: the messages of the requests to models that are not
    decoupled go out in the order the requests were read (one answered early waits for those
    before it); those of a decoupled model's requests go out as they come."""

    def __init__(self, deliver: Deliver, signature: Callable[[str, str], ModelSignature]) -> None:
        self._deliver = deliver
        self._signature = signature
        self._places: deque[_Place] = deque()  # the ordered requests not yet sent, first first

    def place(self, model_name: str, model_version: str) -> Deliver:
        """The `deliver` of a request read now (one to a model that cannot be found is ordered)."""
        try:
            if self._signature(model_name, model_version).decoupled:
                return self._deliver
        except CoreserveError:
            pass
        place = _Place()
        self._places.append(place)

        def deliver(
            message: StreamMessage | None, final: bool, measure: Callable[[], int] | None = None
        ) -> bool:
            if self._places[0] is not place:
                place.held.append((message, final, measure))
                place.answered = place.answered or final
                return True  # (held: its final message, which the bound never refuses)
            accepted = self._deliver(message, final, measure)
            if final:
                self._places.popleft()
                self._release()
            return accepted

        return deliver

    def _release(self) -> None:
        """Sends what the requests now first have held, up to one still unanswered."""
        while self._places:
            first = self._places[0]
            for held in first.held:
                self._deliver(*held)
            first.held.clear()
            if not first.answered:
                return
            self._places.popleft()


def bare_reply(
    model_name: str, model_version: str, request_id: str, final: bool, error: str = ""
) -> pb.ModelStreamInferResponse:
    """A stream message without outputs: a request's error, or its empty final response."""
    encoded = pb.ModelInferResponse(model_name=model_name, model_version=model_version, id=request_id)
    encoded.parameters[FINAL_RESPONSE].bool_param = final
    return pb.ModelStreamInferResponse(error_message=error, infer_response=encoded)
