"""The OpenAI-compatible frontend: its routes on coreserve's own HTTP/1.1 server.

It serves `GET /v1/models`, `GET /v1/models/{model}`, `POST /v1/completions`,
`POST /v1/chat/completions` and `POST /v1/embeddings` (and `GET /health/ready`, as Triton's
OpenAI frontend does), with the HTTP server's limits and timeouts (`--http-max-input-size`,
`--http-*`), every error in OpenAI's format. Requests go through the data plane as the KServe
generate endpoints' do, so batching, statistics, tracing and cancellation apply.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from coreserve.backend.custom_metrics import CustomMetrics
from coreserve.errors import CoreserveError, InvalidArgumentError, NotFoundError
from coreserve.repository import ModelVersion
from coreserve.server.dataplane import DataPlane
from coreserve.server.httpd import (
    DEFAULT_HTTP_LIMITS,
    BodyTooLarge,
    HttpLimits,
    HttpRequest,
    HttpResponse,
    HttpServer,
    Response,
    Router,
    method_not_allowed,
)
from coreserve.server.openai._chat_template import ChatTemplates
from coreserve.server.openai._chunks import embeddings_body
from coreserve.server.openai._errors import ModelNotFound, error_answer, openai_error
from coreserve.server.openai._generation import Generation
from coreserve.server.openai._mapping import embedding_inputs, embedding_output, read_chunk
from coreserve.server.openai._metrics import OpenAIMetrics
from coreserve.server.openai._requests import chat_request, completion_request, embedding_request, parse_body
from coreserve.server.rest import BodyCodec
from coreserve.server.traffic import KEY_HEADER

logger = logging.getLogger(__name__)
OWNER = "coreserve"
# OpenAI takes at most this many texts in one embeddings request.
MAX_EMBEDDING_INPUTS = 2048

Handler = Callable[[HttpRequest], Awaitable[Response]]


def _answers_errors(handler: Handler) -> Handler:
    """Answers domain errors in OpenAI's format (client mistakes are not logged: the client sees them)."""

    async def wrapper(request: HttpRequest) -> Response:
        try:
            return await handler(request)
        except CoreserveError as exc:
            return error_answer(exc, f"{request.method} {request.path}")
        except BodyTooLarge:
            return openai_error(413, "request body too large once decompressed")

    return wrapper


class OpenAIFrontend:
    """Serves OpenAI's API for one data plane on one address and port."""

    def __init__(
        self,
        dataplane: DataPlane,
        custom_metrics: CustomMetrics,
        *,
        address: str,
        port: int,
        max_body_size: int,
        limits: HttpLimits = DEFAULT_HTTP_LIMITS,
        shutdown_timeout: float = 30.0,
        reuse_port: bool = False,
    ) -> None:
        self._dataplane = dataplane
        self._address = address
        self._reuse_port = reuse_port  # the workers of a server of several share the port
        self._codec = BodyCodec(dataplane, max_body_size)  # large compressed bodies inflate off the loop
        self._shutdown_timeout = shutdown_timeout
        self._generation = Generation(dataplane, ChatTemplates(), OpenAIMetrics(custom_metrics))
        self._created = int(time.time())
        self._router = Router()
        routes: list[tuple[str, str, Handler]] = [
            ("GET", "/v1/models", self._models),
            ("GET", "/v1/models/{model}", self._model),
            ("POST", "/v1/completions", self._completions),
            ("POST", "/v1/chat/completions", self._chat_completions),
            ("POST", "/v1/embeddings", self._embeddings),
            ("GET", "/health/ready", self._ready),
        ]
        for method, path, handler in routes:
            self._router.add(method, path, _answers_errors(handler))
        self._server = HttpServer(self._dispatch, openai_error, max_body_size, limits)
        self.port = port

    async def start(self) -> None:
        self.port = await self._server.start(self._address, self.port, reuse_port=self._reuse_port)
        logger.info("Started OpenAIService at %s:%d", self._address, self.port)

    async def stop(self) -> None:
        await self._server.stop(self._shutdown_timeout)
        self._codec.close()

    async def _dispatch(self, request: HttpRequest) -> Response:
        handler = self._router.resolve(request)
        if handler is None:
            allowed = self._router.allowed_methods(request.path)
            if allowed:
                return method_not_allowed(allowed, openai_error)
            path = request.path if len(request.path) <= 200 else request.path[:200] + "…"
            return openai_error(404, f"unknown endpoint: {request.method} {path}")
        return await handler(request)

    def _target(self, name: str, request: HttpRequest | None = None) -> ModelVersion:
        """The ready version of the model a request names (OpenAI's model ids are model names):
        where the model's traffic policy sends it (the header `coreserve-traffic-key` sticks)."""
        try:
            key = request.headers.get(KEY_HEADER) if request is not None else None
            return self._dataplane.traffic.pick(self._dataplane.repository.get(name), key)
        except NotFoundError:
            raise ModelNotFound(
                f"The model '{name}' does not exist (GET /v1/models lists the models)"
            ) from None

    def _card(self, name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": self._created, "owned_by": OWNER}

    async def _models(self, request: HttpRequest) -> HttpResponse:
        names = sorted(model.name for model in self._dataplane.repository.models() if model.takes_requests)
        return _json({"object": "list", "data": [self._card(name) for name in names]})

    async def _model(self, request: HttpRequest) -> HttpResponse:
        name = request.match_info["model"]
        self._target(name)
        return _json(self._card(name))

    async def _ready(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse(200 if self._dataplane.ready() else 503)

    async def _completions(self, request: HttpRequest) -> Response:
        generation = completion_request(parse_body(await self._codec.read_body(request)))
        target = self._target(generation.model, request)
        return await self._generation.answer(request, generation, target, chat=False)

    async def _chat_completions(self, request: HttpRequest) -> Response:
        generation = chat_request(parse_body(await self._codec.read_body(request)))
        target = self._target(generation.model, request)
        return await self._generation.answer(request, generation, target, chat=True)

    async def _embeddings(self, request: HttpRequest) -> HttpResponse:
        embedding = embedding_request(parse_body(await self._codec.read_body(request)))
        if len(embedding.inputs) > MAX_EMBEDDING_INPUTS:
            raise InvalidArgumentError(
                f"'input' takes at most {MAX_EMBEDDING_INPUTS} texts, got {len(embedding.inputs)}"
            )
        target = self._target(embedding.model, request)
        inferences = [embedding_inputs(embedding.model, target.signature, text) for text in embedding.inputs]
        for inference in inferences:
            inference.model_version, inference.routed = str(target.version), True  # (the policy's pick)

        def cancel_all() -> None:
            for inference in inferences:
                inference.cancel()

        if request.disconnected:
            cancel_all()
        request.on_disconnect = cancel_all
        # Each text is a request of its own: a model with a dynamic batcher batches them.
        responses = await asyncio.gather(
            *(
                self._dataplane.infer(inference, endpoint="the OpenAI embeddings endpoint")
                for inference in inferences
            )
        )
        output = embedding_output(target.signature)
        assert output is not None  # embedding_inputs checked it
        counts = [read_chunk(response).input_tokens or 0 for response in responses]
        vectors = [response.outputs[output] for response in responses]
        return HttpResponse(
            200, embeddings_body(embedding.model, vectors, embedding.base64, sum(counts)), "application/json"
        )


def _json(document: dict[str, Any]) -> HttpResponse:
    return HttpResponse(200, orjson.dumps(document), "application/json")
