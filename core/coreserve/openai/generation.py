"""Completions and chat completions: one OpenAI request through the data plane, whole or streamed."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson

from coreserve.errors import CoreserveError
from coreserve.openai.chat_template import ChatTemplates
from coreserve.openai.chunks import DONE, Answer, Usage, event, finish_reason
from coreserve.openai.errors import error_answer
from coreserve.openai.mapping import Chunk, generation_inputs, read_chunk
from coreserve.openai.metrics import ModelTokenMetrics, OpenAIMetrics
from coreserve.openai.requests import GenerationRequest
from coreserve.repository import ModelVersion
from coreserve.server.dataplane import DataPlane
from coreserve.server.http_wire import HttpRequest, HttpResponse, Response, StreamedResponse
from coreserve.types import InferenceRequest, InferenceResponse

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


@dataclass
class _Timing:
    """Times chunks for the metrics: the first one against the request's start, others apart."""

    metrics: ModelTokenMetrics
    started: float
    last: float | None = None
    chunks: int = 0

    def chunk(self, chunk: Chunk) -> None:
        if not chunk.text:
            return
        now = time.perf_counter()
        if self.last is None:
            self.metrics.time_to_first_token.observe(now - self.started)
        else:
            self.metrics.inter_token_latency.observe(now - self.last)
        self.last = now
        self.chunks += 1

    def done(self, usage: Usage) -> None:
        if usage.prompt_tokens is not None:
            self.metrics.prompt_tokens.increment(usage.prompt_tokens)
        # A model that counts no tokens generated one per chunk, as far as the metrics can tell.
        self.metrics.generation_tokens.increment(usage.completion_tokens if usage.reported else self.chunks)


class Generation:
    """Answers completion and chat requests over a data plane."""

    def __init__(self, dataplane: DataPlane, templates: ChatTemplates, metrics: OpenAIMetrics) -> None:
        self._dataplane = dataplane
        self._templates = templates
        self._metrics = metrics

    async def answer(
        self, http: HttpRequest, request: GenerationRequest, target: ModelVersion, chat: bool
    ) -> Response:
        started = time.perf_counter()
        if chat:
            folder = self._dataplane.repository.get(request.model).path
            template = self._templates.template(request.model, target.version, target.config, folder)
            prompt = template.render(request.messages)
        else:
            prompt = request.prompt
        inference = generation_inputs(
            request.model, target.signature, prompt, request.options, request.stream
        )
        inference.model_version = str(target.version)
        _cancel_on_disconnect(http, inference)
        timing = _Timing(self._metrics.model(request.model, target.version), started)
        answer = Answer(request.model, chat)
        max_tokens = request.options.get("max_tokens")
        responses = self._dataplane.stream(inference)
        if not request.stream:
            return await self._whole(responses, answer, timing, max_tokens)
        try:
            first = read_chunk(await anext(responses))
        except StopAsyncIteration:
            first = Chunk("", None, None)
        except BaseException:
            await responses.aclose()
            raise
        return StreamedResponse(
            self._events(first, responses, answer, timing, max_tokens, request.include_usage),
            headers=SSE_HEADERS,
        )

    async def _whole(
        self,
        responses: AsyncGenerator[InferenceResponse, None],
        answer: Answer,
        timing: _Timing,
        max_tokens: int | None,
    ) -> HttpResponse:
        usage = Usage()
        texts = []
        try:
            async for response in responses:
                chunk = read_chunk(response)
                timing.chunk(chunk)
                usage.add(chunk.input_tokens, chunk.output_tokens)
                texts.append(chunk.text)
        finally:
            await responses.aclose()
        timing.done(usage)
        body = answer.whole("".join(texts), finish_reason(usage, max_tokens), usage)
        return HttpResponse(200, body, "application/json")

    async def _events(
        self,
        first: Chunk,
        responses: AsyncGenerator[InferenceResponse, None],
        answer: Answer,
        timing: _Timing,
        max_tokens: int | None,
        include_usage: bool,
    ) -> AsyncIterator[bytes]:
        usage = Usage()
        opening = True
        try:
            async for chunk in _chunks(first, responses):
                timing.chunk(chunk)
                usage.add(chunk.input_tokens, chunk.output_tokens)
                if chunk.text or (opening and answer.chat):  # the chat stream opens with the role
                    yield answer.chunk(chunk.text, first=opening)
                    opening = False
            yield answer.chunk("", finish_reason(usage, max_tokens))
            if include_usage:
                yield answer.usage_chunk(usage)
        except CoreserveError as exc:  # the status is sent: the error travels as an event
            yield event(_error_document(exc, f"the streamed answer {answer.id} of model '{answer.model}'"))
        finally:
            await responses.aclose()  # a client that left cancels the request: see DataPlane.stream
            timing.done(usage)
        yield DONE


async def _chunks(first: Chunk, responses: AsyncGenerator[InferenceResponse, None]) -> AsyncIterator[Chunk]:
    yield first
    async for response in responses:
        yield read_chunk(response)


def _error_document(exc: CoreserveError, where: str) -> dict[str, Any]:
    document: dict[str, Any] = orjson.loads(error_answer(exc, where).body)
    return document


def _cancel_on_disconnect(request: HttpRequest, inference: InferenceRequest) -> None:
    """Cancels `inference` if the client of `request` disconnects before it is answered."""
    if request.disconnected:
        inference.cancel()
    else:
        request.on_disconnect = inference.cancel
