"""The HTTP/REST frontend: KServe v2 endpoints on a lean HTTP/1.1 server, over the data plane."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TypeVar

import orjson

from coreserve.config import config_to_dict
from coreserve.errors import CoreserveError, ErrorCode, InvalidArgumentError
from coreserve.protocol.generate import encode_generate_response
from coreserve.protocol.http_body import (
    HEADER_LENGTH,
)
from coreserve.responses import MAX_WAITING_BYTES
from coreserve.server.dataplane import DataPlane
from coreserve.server.headers import ApiRestrictions, HeaderForwarding
from coreserve.server.httpd import (
    DEFAULT_HTTP_LIMITS,
    BodyTooLarge,
    Handler,
    HttpLimits,
    HttpRequest,
    HttpResponse,
    HttpServer,
    HttpTls,
    Response,
    Router,
    StreamedResponse,
    method_not_allowed,
    unrouted_message,
)
from coreserve.server.rest._body_codec import BodyCodec
from coreserve.server.rest._control import control_routes
from coreserve.server.rest._json_bodies import json_answer
from coreserve.server.rest._shared_memory import shared_memory_routes
from coreserve.server.rest._traffic import traffic_routes
from coreserve.server.traffic import KEY_HEADER
from coreserve.types import InferenceRequest, InferenceResponse, Trace, TraceContext, now_ns

logger = logging.getLogger(__name__)
_T = TypeVar("_T")
# libevhtp's numbers of the methods, which Triton's verbose "HTTP request" lines show (16: other).
_EVHTP_METHODS = {
    "GET": 0,
    "HEAD": 1,
    "POST": 2,
    "PUT": 3,
    "DELETE": 4,
    "OPTIONS": 8,
    "TRACE": 13,
    "PATCH": 15,
}
# The header that keeps a request on one version of a model with traffic weights.

HTTP_STATUS = {  # Triton's (http_server.cc, HttpCodeFromError)
    ErrorCode.INVALID_ARG: 400,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.UNSUPPORTED: 501,
    # These have no status of their own over HTTP (gRPC has one each): 400 as on Triton.
    ErrorCode.ALREADY_EXISTS: 400,
    ErrorCode.CANCELLED: 400,
    ErrorCode.UNKNOWN: 400,
    ErrorCode.PERMISSION_DENIED: 403,
    ErrorCode.INTERNAL: 500,
}


def error_response(status: int, message: str) -> HttpResponse:
    return HttpResponse(status, orjson.dumps({"error": message}), "application/json")


def _handles_errors(handler: Handler, category: str, restrictions: ApiRestrictions) -> Handler:
    """Answers CoreserveErrors as JSON errors, and checks the API restrictions of `category`."""

    async def wrapper(request: HttpRequest) -> Response:
        try:
            if restrictions:
                restrictions.check(category, request.headers)
            return await handler(request)
        except CoreserveError as exc:
            status, message = HTTP_STATUS[exc.code], exc.message
        except BodyTooLarge:
            status, message = 413, "request body too large once decompressed"
        if logger.isEnabledFor(logging.DEBUG):  # (--log-verbose: a refusal before any model too)
            logger.debug("HTTP request %s %s failed: %d %s", request.method, request.path, status, message)
        return error_response(status, message)

    return wrapper


class HttpFrontend:
    """Serves the v2 REST API for one data plane on one address and port."""

    def __init__(
        self,
        dataplane: DataPlane,
        *,
        address: str,
        port: int,
        max_body_size: int,
        limits: HttpLimits = DEFAULT_HTTP_LIMITS,
        restrictions: ApiRestrictions | None = None,
        header_forwarding: HeaderForwarding | None = None,
        shutdown_timeout: float = 30.0,
        tls: HttpTls | None = None,
        reuse_port: bool = False,
    ) -> None:
        self._dataplane = dataplane
        self._reuse_port = reuse_port  # other servers (or workers of this one) bind the port too
        self._tls = tls
        self._address = address
        self._port = port
        self._restrictions = restrictions or ApiRestrictions()
        self._forwarding = header_forwarding or HeaderForwarding()
        self._shutdown_timeout = shutdown_timeout
        self._codec = BodyCodec(dataplane, max_body_size)
        self._router = Router()
        self._add_routes()
        self._server = HttpServer(self._dispatch, error_response, max_body_size, limits)
        self.port = port

    def _add_routes(self) -> None:
        model, version = "/v2/models/{model}", "/v2/models/{model}/versions/{version}"
        routes: list[tuple[str, str, str, Handler]] = [
            ("health", "GET", "/v2/health/live", self._live),
            ("health", "GET", "/v2/health/ready", self._ready),
            ("metadata", "GET", "/v2", self._server_metadata),
            ("statistics", "GET", "/v2/models/stats", self._statistics),  # before /v2/models/{model}
            *[("metadata", "GET", base, self._model_metadata) for base in (model, version)],
            *[("health", "GET", f"{base}/ready", self._model_ready) for base in (model, version)],
            *[("model-config", "GET", f"{base}/config", self._model_config) for base in (model, version)],
            *[("inference", "POST", f"{base}/infer", self._infer) for base in (model, version)],
            *[("inference", "POST", f"{base}/generate", self._generate) for base in (model, version)],
            *[
                ("inference", "POST", f"{base}/generate_stream", self._generate_stream)
                for base in (model, version)
            ],
            *[("statistics", "GET", f"{base}/stats", self._statistics) for base in (model, version)],
            *control_routes(self._dataplane, self._codec.read_body),
            *traffic_routes(self._dataplane, self._codec.read_body),
            *shared_memory_routes(
                self._dataplane.shared_memory, self._dataplane.change, self._codec.read_body
            ),
        ]
        for category, method, path, handler in routes:
            self._router.add(method, path, _handles_errors(handler, category, self._restrictions))

    async def handle(self, request: HttpRequest) -> Response:
        """Answers one request: for this frontend's own HTTP server, or another's (Ray Serve's proxy)."""
        return await self._dispatch(request)

    async def _dispatch(self, request: HttpRequest) -> Response:
        if logger.isEnabledFor(logging.DEBUG):  # Triton's line, its method a number as libevhtp's
            logger.debug("HTTP request: %d %s", _EVHTP_METHODS.get(request.method, 16), request.path)
        handler = self._router.resolve(request)
        if handler is None:
            allowed = self._router.allowed_methods(request.path)
            if allowed:
                return method_not_allowed(allowed, error_response)
            return error_response(404, unrouted_message(request.method, request.path))
        return await handler(request)

    async def start(self) -> None:
        context = self._tls.context() if self._tls is not None else None
        # the real port where 0 was asked
        self.port = await self._server.start(self._address, self._port, context, reuse_port=self._reuse_port)
        logger.info("Started HTTPService at %s:%d%s", self._address, self.port, " (TLS)" if context else "")

    async def stop(self) -> None:
        await self._server.stop(self._shutdown_timeout)
        self._codec.close()

    async def _live(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse(200 if self._dataplane.live() else 400)

    async def _ready(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse(200 if self._dataplane.ready() else 400)

    async def _server_metadata(self, request: HttpRequest) -> HttpResponse:
        return json_answer(self._dataplane.server_metadata())

    async def _model_metadata(self, request: HttpRequest) -> HttpResponse:
        info = request.match_info
        return json_answer(self._dataplane.model_metadata(info["model"], info.get("version", "")))

    async def _model_ready(self, request: HttpRequest) -> HttpResponse:
        info = request.match_info
        if self._dataplane.model_ready(info["model"], info.get("version", "")):
            return HttpResponse(200)
        return error_response(400, "Model version not ready")  # as Triton, for an unknown model too

    async def _model_config(self, request: HttpRequest) -> HttpResponse:
        info = request.match_info
        return json_answer(
            config_to_dict(self._dataplane.model_config(info["model"], info.get("version", "")))
        )

    async def _infer(self, request: HttpRequest) -> HttpResponse:
        tracing = self._dataplane.tracer.active
        received_ns = now_ns() if tracing else 0
        info = request.match_info
        inference, plan = await self._codec.decode_infer(request, info["model"], info.get("version", ""))
        inference.traffic_key = request.headers.get(KEY_HEADER)
        self._forwarding.forward(request.headers.items(), inference)
        _cancel_on_disconnect(request, inference)
        if tracing:
            _trace_context(request, inference, received_ns)
        response = await self._dataplane.infer(inference, endpoint="HTTP end point")
        trace = inference.trace
        if trace is not None:
            trace.mark("HTTP_SEND_START", now_ns())
        payload, json_length = await self._codec.encode_infer(response, plan)
        if trace is not None:  # the answer is encoded and handed to the connection
            trace.mark("HTTP_SEND_END", now_ns())
            trace.finish()
        if json_length is None:
            return HttpResponse(200, payload, "application/json", compress=True)
        return HttpResponse(
            200, payload, "application/octet-stream", {HEADER_LENGTH: str(json_length)}, compress=True
        )

    async def _generate_request(self, request: HttpRequest) -> InferenceRequest:
        tracing = self._dataplane.tracer.active
        received_ns = now_ns() if tracing else 0
        info = request.match_info
        inference = await self._codec.decode_generate(request, info["model"], info.get("version", ""))
        inference.traffic_key = request.headers.get(KEY_HEADER)
        _cancel_on_disconnect(request, inference)
        if tracing:
            _trace_context(request, inference, received_ns)
        return inference

    async def _generate(self, request: HttpRequest) -> HttpResponse:
        """One request, one JSON response: a model that sends another number of responses is
        refused in Triton's words (Triton sends them with status 200), the request cancelled."""
        inference = await self._generate_request(request)
        answers: list[InferenceResponse] = []
        try:
            stream = self._dataplane.stream(inference, frontend_sends=True)
            async with contextlib.aclosing(stream) as responses:
                async for response in responses:
                    answers.append(response)
                    if len(answers) > 1:
                        break  # (the stream, closed unfinished, cancels the request)
            if len(answers) == 1 and answers[0].error is not None:
                raise answers[0].error
            if len(answers) != 1:
                raise InvalidArgumentError(
                    "generate expects model to produce exactly 1 response, use generate stream for model "
                    "that generates various number of responses"
                )
            _mark(inference.trace, "HTTP_SEND_START")
            body = encode_generate_response(answers[0])
            _mark(inference.trace, "HTTP_SEND_END")
        finally:
            if inference.trace is not None:
                inference.trace.finish()
        return HttpResponse(200, body, "application/json")

    async def _generate_stream(self, request: HttpRequest) -> StreamedResponse:
        """One request, its responses as server-sent events; an error ends the stream as an event."""
        inference = await self._generate_request(request)
        bound = MAX_WAITING_BYTES  # (a client that reads slowly must not hold the whole stream here)
        responses = self._dataplane.stream(inference, frontend_sends=True, max_waiting_bytes=bound)
        first: bytes | None = None
        try:
            with contextlib.suppress(StopAsyncIteration):
                response = await anext(responses)
                _mark(inference.trace, "HTTP_SEND_START")
                first = _generate_event(response)
        except CoreserveError as exc:
            if inference.trace is not None:
                inference.trace.finish()
            if not inference.queued_ns:  # refused before it was queued: a JSON error, as Triton's
                raise
            # It failed in the model, or in its queue: the error is the stream's one event (Triton's).
            return StreamedResponse(
                _one_event(orjson.dumps({"error": exc.message})),
                status=HTTP_STATUS[exc.code],
                headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"},
            )

        async def events() -> AsyncIterator[bytes]:
            trace = inference.trace
            try:
                if first is not None:
                    yield b"data: " + first + b"\n\n"
                    _mark(trace, "HTTP_SEND_END")  # the event is handed to the connection
                    async for response in responses:
                        _mark(trace, "HTTP_SEND_START")
                        yield b"data: " + _generate_event(response) + b"\n\n"
                        _mark(trace, "HTTP_SEND_END")
            except CoreserveError as exc:
                yield b"data: " + orjson.dumps({"error": exc.message}) + b"\n\n"
            finally:
                await responses.aclose()  # a client that left cancels the request: see stream()
                if trace is not None:
                    trace.finish()

        return StreamedResponse(
            events(),
            headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"},
        )

    async def _statistics(self, request: HttpRequest) -> HttpResponse:
        info = request.match_info
        statistics = await self._dataplane.server_statistics(info.get("model", ""), info.get("version", ""))
        return json_answer(statistics)


async def _one_event(data: bytes) -> AsyncIterator[bytes]:
    yield b"data: " + data + b"\n\n"


def _generate_event(response: InferenceResponse) -> bytes:
    """One response as generate_stream's event data; a decoupled model's error response that
    does not end the request is an error event, and the stream goes on (as Triton's)."""
    if response.error is not None:
        return orjson.dumps({"error": response.error.message})
    return encode_generate_response(response)


def _cancel_on_disconnect(request: HttpRequest, inference: InferenceRequest) -> None:
    """Cancels `inference` if the client of `request` disconnects before it is answered."""
    if request.disconnected:
        inference.cancel()
    else:
        request.on_disconnect = inference.cancel


def _trace_context(request: HttpRequest, inference: InferenceRequest, received_ns: int) -> None:
    """The HTTP marks and the client's W3C trace context of a request that may be traced."""
    inference.trace_context = TraceContext("HTTP", received_ns, now_ns(), request.headers.get("traceparent"))


def _mark(trace: Trace | None, name: str) -> None:
    """Marks a frontend timestamp (HTTP_SEND_START, ...) on a traced request's trace."""
    if trace is not None:
        trace.mark(name, now_ns())
