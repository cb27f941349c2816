"""OpenAI's response bodies: completions, chat completions, their streamed chunks, embeddings.

Streamed answers are server-sent events, one `data: {json}` per chunk and `data: [DONE]` at
the end, as OpenAI's API sends them. Every chunk of one answer carries the same id and
creation time.
"""

from __future__ import annotations

import base64
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

DONE = b"data: [DONE]\n\n"


def event(document: dict[str, Any]) -> bytes:
    """One server-sent event carrying `document`."""
    return b"data: " + orjson.dumps(document) + b"\n\n"


@dataclass
class Usage:
    """Token counts, where the model reports them (None until it does)."""

    prompt_tokens: int | None = None
    completion_tokens: int = 0
    reported: bool = False

    def add(self, input_tokens: int | None, output_tokens: int | None) -> None:
        # Each response carries the prompt's count; the completion's counts add up (per chunk).
        if input_tokens is not None and self.prompt_tokens is None:
            self.prompt_tokens = input_tokens
        if output_tokens is not None:
            self.completion_tokens += output_tokens
        self.reported = self.reported or input_tokens is not None or output_tokens is not None

    @classmethod
    def total(cls, usages: list[Usage]) -> Usage:
        """The usage of several choices of one prompt: the prompt once, every completion."""
        total = cls()
        for usage in usages:
            if usage.reported:
                total.add(usage.prompt_tokens, usage.completion_tokens)
        return total

    def as_dict(self) -> dict[str, int] | None:
        if not self.reported:
            return None
        prompt = self.prompt_tokens or 0
        return {
            "prompt_tokens": prompt,
            "completion_tokens": self.completion_tokens,
            "total_tokens": prompt + self.completion_tokens,
        }


@dataclass
class Answer:
    """The frame of one answer: its kind (chat or not), id, model and creation time."""

    model: str
    chat: bool
    id: str = field(default="")
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if not self.id:
            self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex

    def _frame(self, streamed: bool) -> dict[str, Any]:
        if self.chat:
            kind = "chat.completion.chunk" if streamed else "chat.completion"
        else:
            kind = "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def _choice(
        self, index: int, text: str | None, finish_reason: str | None, streamed: bool, first: bool
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": index}
        if not self.chat:
            choice["text"] = text or ""
            choice["logprobs"] = None
        elif streamed:
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if text:
                delta["content"] = text
            choice["delta"] = delta
            choice["logprobs"] = None
        else:
            choice["message"] = {"role": "assistant", "content": text}
            choice["logprobs"] = None
        choice["finish_reason"] = finish_reason
        return choice

    def whole(self, choices: list[tuple[str, str]], usage: Usage) -> bytes:
        """The body of an answer that is not streamed: each choice's text and finish reason."""
        document = self._frame(streamed=False)
        document["choices"] = [
            self._choice(index, text, reason, streamed=False, first=True)
            for index, (text, reason) in enumerate(choices)
        ]
        document["usage"] = usage.as_dict()
        return orjson.dumps(document)

    def chunk(self, index: int, text: str, finish_reason: str | None = None, first: bool = False) -> bytes:
        """One streamed chunk of choice `index`: some text, or (with `finish_reason`) its end."""
        document = self._frame(streamed=True)
        document["choices"] = [self._choice(index, text, finish_reason, streamed=True, first=first)]
        return event(document)

    def usage_chunk(self, usage: Usage) -> bytes:
        """The last chunk of a stream that asked for usage (stream_options.include_usage)."""
        document = self._frame(streamed=True)
        document["choices"] = []
        document["usage"] = usage.as_dict()
        return event(document)


def finish_reason(usage: Usage, max_tokens: int | None) -> str:
    """'length' when the model stopped at max_tokens (as its counts tell), else 'stop'."""
    if max_tokens is not None and usage.reported and usage.completion_tokens >= max_tokens:
        return "length"
    return "stop"


def embeddings_body(model: str, vectors: list[np.ndarray], encode_base64: bool, prompt_tokens: int) -> bytes:
    data = []
    for index, vector in enumerate(vectors):
        flat = np.asarray(vector, dtype=np.float32).reshape(-1)
        embedding: Any = (
            base64.b64encode(flat.astype("<f4").tobytes()).decode("ascii") if encode_base64 else flat.tolist()
        )
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
    return orjson.dumps({"object": "list", "data": data, "model": model, "usage": usage})
