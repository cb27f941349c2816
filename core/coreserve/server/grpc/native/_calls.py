"""One gRPC call on an HTTP/2 stream: its messages in, the servicer's handler, its answer out.

The handlers are the ones grpc.aio runs (registered through the same DecodingRegistrar, so the
same tolerant decoding and serializers); `CallContext` gives them the part of
grpc.aio.ServicerContext that coreserve's servicers use.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import zlib
from collections import deque
from collections.abc import AsyncIterator, Callable, Container
from typing import Any, Protocol

import grpc

from coreserve.protocol.grpc_response import SerializedPieces
from coreserve.server.grpc.native._call_status import (
    DEADLINE_EXCEEDED,
    INTERNAL,
    OK,
    RESOURCE_EXHAUSTED,
    UNIMPLEMENTED,
    UNKNOWN,
    CallAborted,
)
from coreserve.server.grpc.native._compression import Compressed, inflate
from coreserve.server.grpc.native._message_reader import MessageReader, MessageTooLarge
from coreserve.server.grpc.native._sending import Outbound
from coreserve.server.grpc.native.frames import _wire as wire
from coreserve.server.grpc.native.headers._request import RequestHeaders

logger = logging.getLogger("coreserve.server.grpc")

_MESSAGE_PREFIX = struct.Struct(">BI")
_INFER_METHODS = ("/ModelInfer", "/ModelStreamInfer")


class ReceiveWindows(Protocol):
    """What a call tells its connection's streams (`_streams.Streams`): its handler took the
    messages that waited, so the stream's receive window may come back."""

    def consumed(self, call: Call) -> None: ...


class CallConnection(Protocol):
    """What a call asks of its connection (`_connection.Http2Connection` is the one): its peer
    and limits, its open calls, its streams' receive windows, its answers under flow control."""

    @property
    def peer(self) -> str: ...

    @property
    def gzip_level(self) -> int: ...

    @property
    def max_message_size(self) -> int: ...

    @property
    def calls(self) -> Container[int]: ...

    @property
    def streams(self) -> ReceiveWindows: ...

    @property
    def outbound(self) -> Outbound[Call]: ...

    def data_sent(self) -> None: ...


class CallContext:
    """The grpc.aio.ServicerContext methods coreserve's servicers call, for a native call."""

    def __init__(self, call: Call) -> None:
        self._call = call

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return self._call.headers.metadata

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: object = ()) -> None:
        raise CallAborted(code.value[0], details)

    def time_remaining(self) -> float | None:
        deadline = self._call.deadline
        return None if deadline is None else max(0.0, deadline - asyncio.get_running_loop().time())

    def cancelled(self) -> bool:
        return self._call.reset

    def peer(self) -> str:
        return self._call.connection.peer

    def send_now(self, response: Any) -> bool:
        """coreserve's own: a streaming handler's response written at once where it can be
        (grpc.aio's context has no such method); False: yield it as usual."""
        return self._call.send_now(response)


class Call:
    """A call's state: received bytes, complete messages, the handler's task, what waits to be sent."""

    def __init__(
        self,
        connection: CallConnection,
        stream_id: int,
        headers: RequestHeaders,
        handler: grpc.RpcMethodHandler,
    ) -> None:
        self.connection = connection
        self.stream_id = stream_id
        self.headers = headers
        self.handler = handler
        self.reader = MessageReader()
        self.messages: deque[bytes | Compressed] = deque()
        self.half_closed = False  # the client sent END_STREAM
        self.reset = False  # the client reset the stream, or the connection went
        self.finished = False  # our trailers are queued
        self.status: CallAborted | None = None  # why the server cancelled the task
        self.task_cancelled = False  # (once: see `cancel`)
        self.task: asyncio.Task[None] | None = None
        self.deadline: float | None = None
        self.deadline_timer: asyncio.TimerHandle | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.headers_sent = False
        # Outbound, under the peer's flow control: bytes not yet framed, then trailers.
        self.send_credit = 0  # granted less sent: the send window is Outbound.initial + this
        self.outbound: deque[memoryview] = deque()
        self.trailers: tuple[int, str, bool] | None = None  # (code, details, trailers only)
        self.drained: asyncio.Future[None] | None = None
        self.unacked = 0  # received bytes whose window the client has not had back
        # --grpc-infer-response-compression-level: inference answers gzipped where the client takes it
        compressed = headers.accepts_gzip and headers.path.endswith(_INFER_METHODS)
        self.gzip_level = connection.gzip_level if compressed else 0

    def set_deadline(self, timeout: float) -> None:
        """Ends the call with DEADLINE_EXCEEDED once `timeout` seconds have passed (grpc-timeout)."""
        loop = asyncio.get_running_loop()
        self.deadline = loop.time() + timeout
        self.deadline_timer = loop.call_later(
            timeout, self.cancel, CallAborted(DEADLINE_EXCEEDED, "Deadline Exceeded")
        )

    # Receiving -----------------------------------------------------------------------------

    def receive(self, payload: memoryview, max_size: int, stable: bool = False) -> None:
        """Adds DATA bytes (`stable`: a view of bytes that never change, kept without a copy);
        splits out complete messages (CallAborted when one is refused)."""
        try:
            complete = self.reader.feed(payload, stable, max_size)
        except MessageTooLarge as exc:
            raise CallAborted(
                RESOURCE_EXHAUSTED, f"Received message larger than max ({exc.length} vs. {max_size})"
            ) from None
        for compressed, message in complete:
            self.messages.append(Compressed(message) if compressed else message)
        self._wake()

    def close_input(self) -> None:
        """The client half-closed the stream."""
        self.half_closed = True
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _requests(self, decode: Callable[[bytes], Any]) -> AsyncIterator[Any]:
        while True:
            while self.messages:
                message = self.messages.popleft()
                self.connection.streams.consumed(self)
                if isinstance(message, Compressed):
                    message = await self._inflate(message)
                yield decode(message)
            if self.half_closed:
                if self.reader.inside_message:
                    raise CallAborted(INTERNAL, "the stream ended inside a message")
                return
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
            self.waiter = None

    # Running -------------------------------------------------------------------------------

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())
        self.task.add_done_callback(self._answer_if_never_run)

    def _answer_if_never_run(self, task: asyncio.Task[None]) -> None:
        """A task cancelled before its first step (a deadline already past) never runs `_run`,
        whose handlers answer: the status it was cancelled with is answered here."""
        if task.cancelled() and self.status is not None:
            self.finish(self.status.code, self.status.details)

    def cancel(self, status: CallAborted | None) -> None:
        """Stops the handler; `status`: the answer the client gets (None: it is gone).

        The handler is cancelled once, as grpcio's server cancels it: the client's reset that
        follows its deadline does not cut short the cleanup the deadline began (a cancelled
        load closing the instances it created)."""
        if status is None:
            self.reset = True
            if self.deadline_timer is not None:
                self.deadline_timer.cancel()
        if self.task is None:
            if status is not None:
                self.finish(status.code, status.details)
            return
        if self.status is None:
            self.status = status
        if not self.task_cancelled:
            self.task_cancelled = True
            self.task.cancel()

    async def _run(self) -> None:
        handler = self.handler
        context = CallContext(self)
        decode = handler.request_deserializer or (lambda data: data)
        encode = handler.response_serializer or (lambda message: message)
        try:
            if handler.request_streaming:
                request: Any = self._requests(decode)
            else:
                message = self._single_message()
                if isinstance(message, Compressed):
                    message = await self._inflate(message)
                request = decode(message)
            if handler.response_streaming:
                behavior = handler.stream_stream if handler.request_streaming else handler.unary_stream
                async for response in behavior(request, context):
                    await self.send(encode(response))
            else:
                behavior = handler.stream_unary if handler.request_streaming else handler.unary_unary
                await self.send(encode(await behavior(request, context)))
        except CallAborted as exc:
            self.finish(exc.code, exc.details)
        except asyncio.CancelledError:
            if self.status is not None:
                self.finish(self.status.code, self.status.details)
            return  # the client went: nothing to answer
        except Exception as exc:
            logger.exception("gRPC call %s failed", self.headers.path)
            self.finish(UNKNOWN, f"Unexpected {type(exc)}: {exc}")
        else:
            self.finish(OK, "")
        finally:
            if self.deadline_timer is not None:
                self.deadline_timer.cancel()

    async def _inflate(self, message: Compressed) -> bytes:
        limit = self.connection.max_message_size
        return await inflate(message, self.headers.encoding, limit, lambda: self.reset)

    def _single_message(self) -> bytes | Compressed:
        if len(self.messages) != 1 or self.reader.inside_message:
            raise CallAborted(
                UNIMPLEMENTED if not self.messages else INTERNAL,
                "a unary call needs exactly one request message",
            )
        message = self.messages.popleft()
        self.connection.streams.consumed(self)
        return message

    # Sending -------------------------------------------------------------------------------

    async def send(self, message: bytes | SerializedPieces) -> None:
        """Sends one message (a large one may come as its pieces: they are written, not joined)."""
        self._write(message)
        outbound = self.connection.outbound
        if self.outbound or outbound.paused:
            # The client reads slower than we answer: hold this handler back (bounded memory).
            await outbound.wait_drained(self)

    def send_now(self, response: Any) -> bool:
        """Writes one response of a streaming handler at once, where nothing of this call waits
        to go out before it and the transport takes more; False: the handler yields it instead."""
        if self.finished or self.reset or self.outbound or self.connection.outbound.paused:
            return False
        encode = self.handler.response_serializer
        try:
            self._write(encode(response) if encode is not None else response)
        except CallAborted:
            return False  # too large: the handler's own send refuses it, ending the call
        return True

    def _write(self, message: bytes | SerializedPieces) -> None:
        """Frames one message as the windows allow; what they do not is queued on the call."""
        limit = self.connection.max_message_size
        size = message.size if isinstance(message, SerializedPieces) else len(message)
        if size > limit:
            raise CallAborted(RESOURCE_EXHAUSTED, f"Sent message larger than max ({size} vs. {limit})")
        if self.reset:
            raise asyncio.CancelledError
        outbound = self.connection.outbound
        self.connection.data_sent()
        flag = 0
        if self.gzip_level:
            joined = message.joined() if isinstance(message, SerializedPieces) else message
            message = zlib.compress(joined, self.gzip_level, wbits=31)
            flag, size = 1, len(message)
        outbound.send_message(self, _MESSAGE_PREFIX.pack(flag, size), message)

    def finish(self, code: int, details: str) -> None:
        if self.finished or self.reset:
            return
        self.finished = True
        if self.deadline_timer is not None:  # (a call refused before its task ran has one too)
            self.deadline_timer.cancel()
        if self.stream_id in self.connection.calls:
            self.connection.outbound.send_trailers(self, code, details)


def refused_call(headers: RequestHeaders, methods: Container[str], max_header_list: int) -> bytes | None:
    """The answer (response headers, or headers and trailers) to a request that cannot become
    a call; None when it can."""
    if headers.size > max_header_list:  # before all: a list cut short may lack any field
        return wire.RESPONSE_HEADERS + wire.status_trailers(
            RESOURCE_EXHAUSTED, f"header list of {headers.size} bytes (at most {max_header_list})"
        )
    if headers.method != b"POST" or not headers.content_type.startswith(b"application/grpc"):
        return wire.http_status(415 if headers.method == b"POST" else 405)
    if headers.path not in methods:
        status = (UNIMPLEMENTED, "Method not found!")
    elif headers.encoding not in (None, b"identity", b"gzip", b"deflate"):
        status = (UNIMPLEMENTED, f"grpc-encoding {headers.encoding.decode('latin-1')} is not supported")
    else:
        return None
    return wire.RESPONSE_HEADERS + wire.status_trailers(*status)
