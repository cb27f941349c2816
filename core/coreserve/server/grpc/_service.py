"""The gRPC inference service: `inference.GRPCInferenceService`'s calls.

A thin adapter over the data plane, as the HTTP frontend is: the same checks, the same
errors (mapped to the status codes Triton uses), the same messages. `_server` puts
it and the health service on a server, grpc.aio's (`_grpcio`) or the native one (`native/`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

import grpc
from google.protobuf import json_format

from coreserve.errors import (
    CoreserveError,
    ErrorCode,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
    clipped,
)
from coreserve.protocol.grpc_received import ReceivedInferRequest
from coreserve.protocol.grpc_response import (
    SerializedPieces,
    encode_model_infer_response,
    serialize_model_infer_response,
    serialize_model_stream_infer_response,
)
from coreserve.protocol.output_plan import OutputPlan
from coreserve.protos import grpc_service_pb2 as pb
from coreserve.protos import grpc_service_pb2_grpc as pb_grpc
from coreserve.responses import MAX_WAITING_BYTES, StreamingResponses, output_bytes
from coreserve.server import changes
from coreserve.server.dataplane import DataPlane
from coreserve.server.grpc._stream import FINAL_RESPONSE, InOrder, StreamCall, StreamMessage, bare_reply
from coreserve.server.headers import ApiRestrictions, HeaderForwarding
from coreserve.types import InferenceRequest, InferenceResponse, Trace, TraceContext, now_ns

GRPC_STATUS = {
    ErrorCode.INVALID_ARG: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    ErrorCode.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    ErrorCode.CANCELLED: grpc.StatusCode.CANCELLED,
    ErrorCode.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    ErrorCode.INTERNAL: grpc.StatusCode.INTERNAL,
    ErrorCode.UNKNOWN: grpc.StatusCode.UNKNOWN,
}
INFERENCE_SERVICE = "inference.GRPCInferenceService"
# Request and response parameters of Triton's streaming protocol.
ENABLE_EMPTY_FINAL = "triton_enable_empty_final_response"
GRPC_ERROR_HEADER = "triton_grpc_error"
# Requests of one ModelStreamInfer stream that may be open (read, and their last response not
# yet sent) before the stream stops reading: a client that sends faster than the models answer,
# or that reads no answers, holds at most this many requests and their responses in memory.
DEFAULT_MAX_STREAM_INFLIGHT = 1024
# The fields of a gRPC repository index entry (the HTTP index may give more).
_INDEX_FIELDS = frozenset({"name", "version", "state", "reason"})

Request = TypeVar("Request")
Response = TypeVar("Response")
Handler = Callable[[Any, Request, grpc.aio.ServicerContext], Awaitable[Response]]
_CUT_OFF = UnavailableError(
    f"the responses were taken too slowly: more than {MAX_WAITING_BYTES} bytes of outputs waited on "
    "this stream; the request was cancelled"
)


def _metadata(context: grpc.aio.ServicerContext) -> dict[str, str]:
    return {key: value for key, value in (context.invocation_metadata() or ()) if isinstance(value, str)}


def _unary(category: str) -> Callable[[Handler[Request, Response]], Handler[Request, Response]]:
    """Checks the API restrictions of `category`; turns CoreserveErrors into Triton's statuses."""

    def decorate(handler: Handler[Request, Response]) -> Handler[Request, Response]:
        async def wrapper(self: Any, request: Request, context: grpc.aio.ServicerContext) -> Response:
            try:
                if self._restrictions:
                    self._restrictions.check(category, _metadata(context))
                return await handler(self, request, context)
            except CoreserveError as exc:
                await context.abort(GRPC_STATUS[exc.code], exc.message)
                raise  # abort raises; this keeps type checkers informed

        return wrapper

    return decorate


def _repository_parameter(parameter: pb.ModelRepositoryParameter) -> object:
    choice = parameter.WhichOneof("parameter_choice")
    return getattr(parameter, choice) if choice else None


def _log_setting(value: pb.LogSettingsRequest.SettingValue) -> object:
    choice = value.WhichOneof("parameter_choice")
    return getattr(value, choice) if choice else None


def _trace_context(inference: InferenceRequest, context: Any, received_ns: int) -> None:
    """The gRPC marks and the client's W3C trace context of a request that may be traced."""
    traceparent = _metadata(context).get("traceparent")
    inference.trace_context = TraceContext("GRPC", received_ns, now_ns(), traceparent)


def _traced_encoding(trace: Trace, response: InferenceResponse, plan: OutputPlan) -> pb.ModelInferResponse:
    trace.mark("GRPC_SEND_START", now_ns())
    message = encode_model_infer_response(response, plan)
    trace.mark("GRPC_SEND_END", now_ns())
    trace.finish()
    return message


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    """The v2 inference service over the data plane."""

    def __init__(
        self,
        dataplane: DataPlane,
        restrictions: ApiRestrictions | None = None,
        max_stream_inflight: int = DEFAULT_MAX_STREAM_INFLIGHT,
        header_forwarding: HeaderForwarding | None = None,
    ) -> None:
        self._dataplane = dataplane
        self._restrictions = restrictions or ApiRestrictions()
        self._max_stream_inflight = max_stream_inflight
        self._forwarding = header_forwarding or HeaderForwarding()

    @_unary("health")
    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self._dataplane.live())

    @_unary("health")
    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self._dataplane.ready())

    @_unary("health")
    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        # Not ready, as Triton answers, for an unknown model too; a malformed version is an error.
        return pb.ModelReadyResponse(ready=self._dataplane.model_ready(request.name, request.version))

    @_unary("metadata")
    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: Any
    ) -> pb.ServerMetadataResponse:
        return json_format.ParseDict(self._dataplane.server_metadata(), pb.ServerMetadataResponse())

    @_unary("metadata")
    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        metadata = self._dataplane.model_metadata(request.name, request.version)
        return json_format.ParseDict(metadata, pb.ModelMetadataResponse())

    @_unary("model-config")
    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Any) -> pb.ModelConfigResponse:
        return pb.ModelConfigResponse(config=self._dataplane.model_config(request.name, request.version))

    @_unary("statistics")
    async def ModelStatistics(
        self, request: pb.ModelStatisticsRequest, context: Any
    ) -> pb.ModelStatisticsResponse:
        statistics = await self._dataplane.server_statistics(request.name, request.version)
        return json_format.ParseDict(statistics, pb.ModelStatisticsResponse())

    @_unary("model-repository")
    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest, context: Any
    ) -> pb.RepositoryIndexResponse:
        if request.repository_name:
            raise changes.repository_named()
        index = await self._dataplane.repository_index(ready_only=request.ready)
        return pb.RepositoryIndexResponse(
            models=[  # (Triton's fields: the HTTP index's extra ones have none here)
                pb.RepositoryIndexResponse.ModelIndex(
                    **{k: v for k, v in entry.items() if k in _INDEX_FIELDS}
                )
                for entry in index
            ]
        )

    @_unary("model-repository")
    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: Any
    ) -> pb.RepositoryModelLoadResponse:
        if request.repository_name:
            raise changes.repository_named()
        parameters = {key: _repository_parameter(value) for key, value in request.parameters.items()}
        await self._dataplane.load_model(request.model_name, parameters)
        return pb.RepositoryModelLoadResponse()

    @_unary("model-repository")
    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Any
    ) -> pb.RepositoryModelUnloadResponse:
        if request.repository_name:
            raise changes.repository_named()
        flag = request.parameters.get("unload_dependents")
        if flag is not None and flag.WhichOneof("parameter_choice") != "bool_param":  # Triton's words
            raise InvalidArgumentError(
                "invalid value type for 'unload_dependents' parameter, expected bool_param."
            )
        await self._dataplane.unload_model(request.model_name, flag is not None and flag.bool_param)
        return pb.RepositoryModelUnloadResponse()

    @_unary("shared-memory")
    async def SystemSharedMemoryStatus(
        self, request: pb.SystemSharedMemoryStatusRequest, context: Any
    ) -> pb.SystemSharedMemoryStatusResponse:
        response = pb.SystemSharedMemoryStatusResponse()
        for region in self._dataplane.shared_memory.status(request.name):
            response.regions[region["name"]].CopyFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(**region)
            )
        return response

    @_unary("shared-memory")
    async def SystemSharedMemoryRegister(
        self, request: pb.SystemSharedMemoryRegisterRequest, context: Any
    ) -> pb.SystemSharedMemoryRegisterResponse:
        await self._dataplane.change(
            changes.RegisterSystemRegion(request.name, request.key, request.offset, request.byte_size)
        )
        return pb.SystemSharedMemoryRegisterResponse()

    @_unary("shared-memory")
    async def SystemSharedMemoryUnregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest, context: Any
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        await self._dataplane.change(changes.UnregisterSystemRegion(request.name))
        return pb.SystemSharedMemoryUnregisterResponse()

    @_unary("shared-memory")
    async def CudaSharedMemoryStatus(
        self, request: pb.CudaSharedMemoryStatusRequest, context: Any
    ) -> pb.CudaSharedMemoryStatusResponse:
        cuda = self._dataplane.shared_memory.cuda
        response = pb.CudaSharedMemoryStatusResponse()
        if cuda is None:
            if request.name:  # no region can be registered, so none is found
                raise NotFoundError(f"Unable to find cuda shared memory region: '{request.name}'")
            return response
        for region in cuda.status(request.name):
            response.regions[region["name"]].CopyFrom(
                pb.CudaSharedMemoryStatusResponse.RegionStatus(**region)
            )
        return response

    @_unary("shared-memory")
    async def CudaSharedMemoryRegister(
        self, request: pb.CudaSharedMemoryRegisterRequest, context: Any
    ) -> pb.CudaSharedMemoryRegisterResponse:
        await self._dataplane.change(
            changes.RegisterCudaRegion(request.name, request.raw_handle, request.device_id, request.byte_size)
        )
        return pb.CudaSharedMemoryRegisterResponse()

    @_unary("shared-memory")
    async def CudaSharedMemoryUnregister(
        self, request: pb.CudaSharedMemoryUnregisterRequest, context: Any
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        await self._dataplane.change(changes.UnregisterCudaRegion(request.name))
        return pb.CudaSharedMemoryUnregisterResponse()

    @_unary("trace")
    async def TraceSetting(self, request: pb.TraceSettingRequest, context: Any) -> pb.TraceSettingResponse:
        # An empty value list clears a setting, as JSON's null does over HTTP.
        for key, value in request.settings.items():
            if key != "trace_level" and len(value.value) > 1:
                raise InvalidArgumentError(f"expect only 1 value for '{clipped(key)}'")  # Triton's words
        wanted: dict[str, Any] = {
            key: (list(value.value) if key == "trace_level" else value.value[0]) if value.value else None
            for key, value in request.settings.items()
        }
        if wanted:
            setting = await self._dataplane.update_trace_setting(wanted, request.model_name)
        else:
            setting = self._dataplane.trace_setting(request.model_name)
        response = pb.TraceSettingResponse()
        for key, value in setting.items():
            response.settings[key].value.extend(value if isinstance(value, list) else [value])
        return response

    @_unary("logging")
    async def LogSettings(self, request: pb.LogSettingsRequest, context: Any) -> pb.LogSettingsResponse:
        wanted = {key: _log_setting(value) for key, value in request.settings.items()}
        dataplane = self._dataplane
        settings = await dataplane.update_log_settings(wanted) if wanted else dataplane.log_settings()
        response = pb.LogSettingsResponse()
        for key, value in settings.as_dict().items():
            field = {bool: "bool_param", int: "uint32_param", str: "string_param"}[type(value)]
            setattr(response.settings[key], field, value)
        return response

    @_unary("inference")
    async def ModelInfer(
        self, received: ReceivedInferRequest, context: Any
    ) -> bytes | SerializedPieces | pb.ModelInferResponse:
        tracing = self._dataplane.tracer.active
        received_ns = now_ns() if tracing else 0
        inference, plan = self._decode(received)
        if self._forwarding:
            self._forwarding.forward(_metadata(context).items(), inference)
        if tracing:
            _trace_context(inference, context, received_ns)
        response = await self._dataplane.infer(inference, endpoint="ModelInfer RPC")
        if inference.trace is None:
            return serialize_model_infer_response(response, plan)
        return _traced_encoding(inference.trace, response, plan)

    def _decode(self, received: ReceivedInferRequest) -> tuple[InferenceRequest, OutputPlan]:
        """The request and its output plan; a mistake in its inputs or outputs is answered
        only for a model that serves.

        Triton finds the model (name and version) before it reads the inputs: a request with
        both kinds of mistake gets the model's error, as there. Looked up only on an error, so
        a good request pays nothing for it.
        """
        try:
            return received.decode(self._dataplane.shared_memory)
        except CoreserveError as exc:
            error = exc
        message = received.message
        self._dataplane.model_version(message.model_name, message.model_version)
        raise error

    async def ModelStreamInfer(
        self, requests: AsyncIterator[ReceivedInferRequest], context: Any
    ) -> AsyncIterator[StreamMessage]:
        """Many requests on one stream; each response or error goes back as it comes.

        A request's error is sent as that request's message and the stream stays open.
        Decoupled models send several responses per request through the same path. The
        stream's bounds are StreamCall's: past its bound of outputs waiting, the request whose
        response would wait is cancelled, and its final message says why.
        """
        if self._restrictions:
            try:
                self._restrictions.check("inference", _metadata(context))
            except CoreserveError as exc:
                await context.abort(GRPC_STATUS[exc.code], exc.message)
        # The native transport writes a message at once where nothing waits before it.
        call = StreamCall(self._max_stream_inflight, getattr(context, "send_now", None))
        running: set[InferenceRequest] = set()  # submitted, and their last response not yet given
        # Triton's `triton_grpc_error: true` header: the first error ends the call with its status.
        fail = call.fail if _metadata(context).get(GRPC_ERROR_HEADER) == "true" else None

        in_order = InOrder(call.deliver, self._dataplane.model_signature)

        async def start(message: ReceivedInferRequest) -> None:
            await self._dataplane.load_on_demand(message.message)
            deliver = in_order.place(message.message.model_name, message.message.model_version)
            self._start_stream_request(message, deliver, running, context, fail)

        reader = asyncio.create_task(call.read(requests, start))
        try:
            async for message in call.messages():
                yield message
            if call.failure is not None:
                await context.abort(GRPC_STATUS[call.failure.code], call.failure.message)
            await reader
        finally:
            reader.cancel()
            # The stream ended before these were answered (the client cancelled it, or its
            # deadline passed): nobody will read their responses.
            for request in list(running):
                request.cancel()

    def _start_stream_request(
        self,
        received: ReceivedInferRequest,
        deliver: Callable[[StreamMessage | None, bool, Callable[[], int] | None], bool],
        running: set[InferenceRequest],
        context: Any,
        fail: Callable[[CoreserveError], None] | None = None,
    ) -> None:
        tracing = self._dataplane.tracer.active
        received_ns = now_ns() if tracing else 0
        message = received.message

        def error_message(error: CoreserveError) -> None:
            if fail is not None:
                fail(error)
                return
            # An error ends the request: a client that waits for the flag sees it.
            name, version = message.model_name, message.model_version
            deliver(bare_reply(name, version, received.request_id, True, error.message), True, None)

        try:
            request, plan = self._decode(received)
            empty_final = request.parameters.pop(ENABLE_EMPTY_FINAL, False) is True
            if self._forwarding:  # the stream's metadata, for each of its requests
                self._forwarding.forward(_metadata(context).items(), request)
        except CoreserveError as exc:
            error_message(exc)
            return
        if tracing:  # the stream's metadata (its traceparent) holds for each of its requests
            _trace_context(request, context, received_ns)

        too_slow = False  # its responses were cut off: the stream held too many outputs

        def on_response(response: InferenceResponse | None, final: bool) -> None:
            nonlocal too_slow
            if too_slow:  # dropped; the final message says why
                if final:
                    on_error(_CUT_OFF)
                return
            # Called before the trace ends with the final response: the send marks are in it.
            trace = request.trace
            if trace is not None:
                trace.mark("GRPC_SEND_START", now_ns())
            reply: StreamMessage | None = None
            # (an error a decoupled model sends without ending the request)
            error = None if response is None else response.error
            if response is not None and error is None:
                try:  # every response says whether it is the last, as Triton's do
                    reply = serialize_model_stream_infer_response(response, plan, {FINAL_RESPONSE: final})
                except CoreserveError as exc:  # an output too large for its shared memory region
                    error = exc
            if error is not None and fail is not None:
                fail(error)  # (the call ends: its requests still running are cancelled)
                return
            if error is not None:
                reply = bare_reply(request.model_name, "", request.id, final, error.message)
            elif response is None and empty_final:
                reply = bare_reply(request.model_name, "", request.id, True)
            if final:
                running.discard(request)
            measure = None if response is None else partial(output_bytes, response, plan.shared_memory)
            if (reply is not None or final) and not deliver(reply, final, measure):
                too_slow = True
                request.cancel()
            if trace is not None:
                trace.mark("GRPC_SEND_END", now_ns())

        def on_error(error: CoreserveError) -> None:
            running.discard(request)
            error_message(_CUT_OFF if too_slow else error)

        try:
            self._dataplane.submit(request, StreamingResponses(on_response, on_error))
        except CoreserveError as exc:
            error_message(exc)
            return
        running.add(request)  # (no response can come before submit returns)
