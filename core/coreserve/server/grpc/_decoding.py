"""Request messages that do not decode get INVALID_ARGUMENT, not UNKNOWN and a logged traceback.

grpc.aio decodes a request before any servicer code runs; when the bytes are not a valid
message, its DecodeError becomes UNKNOWN for the client and a traceback in the log, one per
request (a cheap log flood). DecodingRegistrar registers every method with a handler that sees
such a message as a marker instead, and answers it as the client error it is.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError


class _Undecodable:
    """Stands in for a request message whose bytes did not decode."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


class DecodingRegistrar:
    """Registers generated services on a server with handlers that decode their own requests.

    Pass it where the generated `add_*Servicer_to_server(servicer, server)` functions expect
    the server. Doing this at registration, rather than in an interceptor, costs nothing per
    call: a grpc.aio server with any interceptor runs the interceptor chain as a coroutine on
    every call and cannot use its registered-method fast path.
    """

    def __init__(
        self,
        server: grpc.aio.Server,
        deserializers: dict[str, Callable[[bytes], Any]] | None = None,
        serializers: dict[str, Callable[[Any], Any]] | None = None,
    ) -> None:
        """`deserializers`: what decodes the requests of some methods instead of the generated
        message's FromString, by method name; they raise DecodeError as FromString does.
        `serializers`: what encodes the responses of some methods, by method name (to bytes,
        or what else the server takes: see add_services)."""
        self._server = server
        self._deserializers = deserializers or {}
        self._serializers = serializers or {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        """Ignored: the generated code passes the same handlers to add_registered_method_handlers."""

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        wrapped = {
            name: _decoding_in_handler(
                handler, f"/{service}/{name}", self._deserializers.get(name), self._serializers.get(name)
            )
            for name, handler in handlers.items()
        }
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, wrapped),))
        self._server.add_registered_method_handlers(service, wrapped)


def _decoding_in_handler(
    handler: grpc.RpcMethodHandler,
    method: str,
    deserializer: Callable[[bytes], Any] | None = None,
    serializer: Callable[[Any], Any] | None = None,
) -> grpc.RpcMethodHandler:
    """The same handler, decoding its request itself (with `deserializer` if given)."""
    decode = deserializer or handler.request_deserializer

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
        response_serializer=serializer or handler.response_serializer,
    )
