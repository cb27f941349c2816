"""Completions and chat completions: one OpenAI request through the data plane, whole or streamed."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import orjson

from coreserve.errors import CoreserveError
from coreserve.repository import ModelVersion
from coreserve.responses import MAX_WAITING_BYTES
from coreserve.server.dataplane import DataPlane
from coreserve.server.httpd import HttpRequest, HttpResponse, Response, StreamedResponse
from coreserve.server.openai._chat_template import ChatTemplates
from coreserve.server.openai._choices import Choice, ChoiceTiming, merged, run_all
from coreserve.server.openai._chunks import DONE, Answer, Usage, event, finish_reason
from coreserve.server.openai._errors import error_answer
from coreserve.server.openai._mapping import Chunk, generation_inputs
from coreserve.server.openai._metrics import OpenAIMetrics
from coreserve.server.openai._requests import GenerationRequest
from coreserve.types import InferenceRequest

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


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
        inferences = [
            generation_inputs(request.model, target.signature, prompt, options, request.stream)
            for options in _choice_options(request)
        ]
        for inference in inferences:
            inference.model_version, inference.routed = str(target.version), True  # (the policy's pick)
        _cancel_on_disconnect(http, inferences)
        metrics = self._metrics.model(request.model, target.version)
        choices = [
            Choice(
                index,
                self._dataplane.stream(inference, max_waiting_bytes=MAX_WAITING_BYTES),
                ChoiceTiming(metrics, started),
            )
            for index, inference in enumerate(inferences)
        ]
        answer = Answer(request.model, chat)
        max_tokens = request.options.get("max_tokens")
        try:
            if request.stream:
                # The status goes out with the first chunks: a model that refuses the request gets its 4xx.
                firsts = await run_all([choice.first() for choice in choices])
            else:
                texts = await run_all([choice.text() for choice in choices])
        except BaseException:
            for choice in choices:
                await choice.close()
            raise
        if request.stream:
            events = self._events(
                list(zip(choices, firsts, strict=True)), answer, max_tokens, request.include_usage
            )
            return StreamedResponse(events, headers=SSE_HEADERS)
        for choice in choices:
            await choice.close()
        reasons = [finish_reason(choice.usage, max_tokens) for choice in choices]
        body = answer.whole(list(zip(texts, reasons, strict=True)), Usage.total([c.usage for c in choices]))
        return HttpResponse(200, body, "application/json")

    async def _events(
        self,
        firsts: list[tuple[Choice, Chunk]],
        answer: Answer,
        max_tokens: int | None,
        include_usage: bool,
    ) -> AsyncIterator[bytes]:
        choices = [choice for choice, _ in firsts]
        rest = merged(choices)
        try:
            for choice, chunk in firsts:
                if chunk.text or answer.chat:  # a chat stream opens each choice with its role
                    yield _chunk_event(answer, choice, chunk)
            async for choice, found in rest:
                if found is None:
                    yield answer.chunk(choice.index, "", finish_reason(choice.usage, max_tokens))
                elif found.text or (answer.chat and not choice.opened):
                    yield _chunk_event(answer, choice, found)
            if include_usage:
                yield answer.usage_chunk(Usage.total([choice.usage for choice in choices]))
        except CoreserveError as exc:  # the status is sent: the error travels as an event
            yield event(_error_document(exc, f"the streamed answer {answer.id} of model '{answer.model}'"))
        finally:
            await rest.aclose()  # stops the readers of several choices first
            for choice in choices:  # a client that left cancels the requests: see DataPlane.stream
                await choice.close()
        yield DONE


def _chunk_event(answer: Answer, choice: Choice, chunk: Chunk) -> bytes:
    opening = not choice.opened
    choice.opened = True
    return answer.chunk(choice.index, chunk.text, first=opening)


def _choice_options(request: GenerationRequest) -> list[dict[str, Any]]:
    """Each choice's options: with a seed, choice i samples with seed + i (else all would be one),
    or seed - i where seed + i would leave the range the seed is in (INT64's, or UINT64's)."""
    seed = request.options.get("seed")
    if request.n == 1 or seed is None:
        return [request.options] * request.n
    last = seed + request.n - 1 if isinstance(seed, int) else 0
    step = -1 if isinstance(seed, int) and (seed < 2**63 <= last or last >= 2**64) else 1
    return [{**request.options, "seed": seed + step * index} for index in range(request.n)]


def _error_document(exc: CoreserveError, where: str) -> dict[str, Any]:
    document: dict[str, Any] = orjson.loads(error_answer(exc, where).body)
    return document


def _cancel_on_disconnect(request: HttpRequest, inferences: list[InferenceRequest]) -> None:
    """Cancels the requests if the client of `request` disconnects before it is answered."""

    def cancel() -> None:
        for inference in inferences:
            inference.cancel()

    if request.disconnected:
        cancel()
    else:
        request.on_disconnect = cancel
