"""The choices of one answer: each its own inference request, timed, counted and read together.

An OpenAI request for `n` choices is `n` requests to the model (the data plane schedules and
batches them as any others). These helpers run them side by side: the first failure cancels the
rest, and a streamed answer merges their chunks in the order they arrive.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Awaitable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from coreserve.server.openai._chunks import Usage
from coreserve.server.openai._mapping import Chunk, read_chunk
from coreserve.server.openai._metrics import ModelTokenMetrics
from coreserve.types import InferenceResponse

T = TypeVar("T")


@dataclass
class ChoiceTiming:
    """Times a choice's chunks for the metrics: the first against the request's start, others apart."""

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


@dataclass
class Choice:
    """One choice: its request's responses (from DataPlane.stream), timing and usage."""

    index: int
    responses: AsyncGenerator[InferenceResponse, None]
    timing: ChoiceTiming
    usage: Usage = field(default_factory=Usage)
    opened: bool = False  # its first chunk was sent (a chat stream's first one carries the role)
    counted: bool = False

    def read(self, response: InferenceResponse) -> Chunk:
        if response.error is not None:  # a decoupled model's error ends the answer here
            raise response.error
        chunk = read_chunk(response)
        self.timing.chunk(chunk)
        self.usage.add(chunk.input_tokens, chunk.output_tokens)
        return chunk

    async def first(self) -> Chunk:
        """Its first chunk (an empty one if the model sent no response)."""
        try:
            return self.read(await anext(self.responses))
        except StopAsyncIteration:
            return Chunk("", None, None)

    async def text(self) -> str:
        """All of its text, read to the end."""
        texts = []
        try:
            async for response in self.responses:
                texts.append(self.read(response).text)
        finally:
            await self.responses.aclose()
        return "".join(texts)

    async def close(self) -> None:
        """Stops reading (a request still running is cancelled: see DataPlane.stream); counts it once."""
        await self.responses.aclose()
        if not self.counted:
            self.counted = True
            self.timing.done(self.usage)


async def run_all(coroutines: Sequence[Awaitable[T]]) -> list[T]:
    """Awaits them side by side; the first failure cancels the others (waited for) and is raised."""
    if len(coroutines) == 1:
        return [await coroutines[0]]
    tasks = [asyncio.ensure_future(coroutine) for coroutine in coroutines]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def merged(choices: Sequence[Choice]) -> AsyncGenerator[tuple[Choice, Chunk | None], None]:
    """The remaining chunks of every choice as they arrive; (choice, None) when a choice ends."""
    if len(choices) == 1:  # no tasks for the common case
        (choice,) = choices
        async for response in choice.responses:
            yield choice, choice.read(response)
        yield choice, None
        return
    queue: asyncio.Queue[tuple[Choice, Chunk | None] | Exception] = asyncio.Queue()

    async def pump(choice: Choice) -> None:
        try:
            async for response in choice.responses:
                queue.put_nowait((choice, choice.read(response)))
            queue.put_nowait((choice, None))
        except Exception as exc:  # a model's error ends the whole answer: see the reader
            queue.put_nowait(exc)

    tasks = [asyncio.ensure_future(pump(choice)) for choice in choices]
    try:
        running = len(choices)
        while running:
            item = await queue.get()
            if isinstance(item, Exception):
                raise item
            running -= item[1] is None
            yield item
    finally:
        for task in tasks:  # a cancelled pump's request is cancelled by its stream (DataPlane.stream)
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
