"""Request messages that do not decode get INVALID_ARGUMENT, not UNKNOWN and a logged traceback.

grpc.aio decodes a request before any servicer code runs; when the bytes are not a valid
message, its DecodeError becomes UNKNOWN for the client and a traceback in the log, one per
request (a cheap log flood). This interceptor has the handler see such a message as a marker
instead, and answer it as the client error it is.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError


class _Undecodable:
    """Stands in for a request message whose bytes did not decode."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


class DecodeInHandlers(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Makes every handler answer undecodable request messages with INVALID_ARGUMENT.

    Each method's wrapped handler is made once: the interceptor runs on every call.
    """

    def __init__(self) -> None:
        self._wrapped: dict[str, grpc.RpcMethodHandler] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        wrapped = self._wrapped.get(details.method)
        if wrapped is not None:
            return wrapped
        handler = await continuation(details)
        if handler is None or handler.request_deserializer is None:
            return handler
        wrapped = self._wrapped[details.method] = _decoding_in_handler(handler, details.method)
        return wrapped


def _decoding_in_handler(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    """The same handler, decoding its request itself."""
    decode = handler.request_deserializer

    def tolerant_decode(data: bytes) -> Any:
        try:
            return decode(data)
        except DecodeError as exc:
            return _Undecodable(str(exc))

    async def refuse(request: _Undecodable, context: grpc.aio.ServicerContext) -> None:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"the request is not a valid message for {method}: {request.reason}",
        )

    def checked(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async def messages() -> AsyncIterator[Any]:
            async for request in requests:
                if isinstance(request, _Undecodable):
                    await refuse(request, context)
                yield request

        return messages()

    kind = {
        (False, False): (handler.unary_unary, grpc.unary_unary_rpc_method_handler),
        (False, True): (handler.unary_stream, grpc.unary_stream_rpc_method_handler),
        (True, False): (handler.stream_unary, grpc.stream_unary_rpc_method_handler),
        (True, True): (handler.stream_stream, grpc.stream_stream_rpc_method_handler),
    }
    behavior, make_handler = kind[(handler.request_streaming, handler.response_streaming)]

    async def one_response(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if handler.request_streaming:
            request = checked(request, context)
        elif isinstance(request, _Undecodable):
            await refuse(request, context)
        return await behavior(request, context)

    # (Our response-streaming servicer methods are async generators, which this relies on.)
    async def responses(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        if handler.request_streaming:
            request = checked(request, context)
        elif isinstance(request, _Undecodable):
            await refuse(request, context)
        async for response in behavior(request, context):
            yield response

    return make_handler(
        responses if handler.response_streaming else one_response,
        request_deserializer=tolerant_decode,
        response_serializer=handler.response_serializer,
    )
