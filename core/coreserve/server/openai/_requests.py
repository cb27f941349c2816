"""OpenAI request bodies, checked: what each endpoint takes, in OpenAI's types and ranges.

Keys the frontend itself acts on (`model`, `prompt`, `messages`, `stream`, `n`…) are taken
out here; every other key with a value is a *sampling option* that the model must take as an
input (see `mapping`). The well-known options are checked against OpenAI's documented types
and ranges first, so that `max_tokens: 0` is a 400 whatever the model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import orjson

from coreserve.errors import InvalidArgumentError, quoted_value
from coreserve.server.openai._errors import OptionError

# Keys that OpenAI defines as information about the caller: accepted and not passed on.
_CALLER_KEYS = ("user",)
_ROLES = ("system", "developer", "user", "assistant", "tool")
_MAX_STOP_SEQUENCES = 4
# Each choice is a request of its own: this bounds what one client request can set running.
MAX_CHOICES = 16


@dataclass
class GenerationRequest:
    """A completion or chat completion request: what the frontend and the model each get."""

    model: str
    n: int = 1  # choices: each its own inference request
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage
    options: dict[str, Any] = field(default_factory=dict)  # sampling options, for the model
    prompt: str = ""  # completions
    messages: list[dict[str, Any]] = field(default_factory=list)  # chat


@dataclass
class EmbeddingRequest:
    model: str
    inputs: list[str]
    base64: bool = False  # encoding_format "base64": little-endian float32 bytes, base64-encoded


def parse_body(body: bytes | bytearray) -> dict[str, Any]:
    """The request's JSON object."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidArgumentError(f"malformed JSON in the request body: {exc}") from None
    if not isinstance(document, dict):
        raise InvalidArgumentError("the request body must be a JSON object")
    return document


def completion_request(document: dict[str, Any]) -> GenerationRequest:
    """A /v1/completions body, checked."""
    request = _generation_request(document, ("prompt",))
    request.prompt = _prompt(document.get("prompt"))
    return request


def chat_request(document: dict[str, Any]) -> GenerationRequest:
    """A /v1/chat/completions body, checked (the messages' contents flattened to text)."""
    request = _generation_request(document, ("messages",))
    # max_completion_tokens is the chat API's newer name for max_tokens.
    newer = request.options.pop("max_completion_tokens", None)
    if newer is not None:
        request.options["max_tokens"] = _check_option("max_completion_tokens", newer)
    request.messages = _messages(document.get("messages"))
    return request


def embedding_request(document: dict[str, Any]) -> EmbeddingRequest:
    """A /v1/embeddings body, checked."""
    model = _model(document)
    given = document.get("input")
    texts = [given] if isinstance(given, str) else given
    if not isinstance(texts, list) or not texts or not all(isinstance(text, str) for text in texts):
        raise OptionError(
            "input",
            "'input' must be a string or a non-empty array of strings (token arrays are not supported)",
        )
    encoding = document.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise OptionError(
            "encoding_format", f"'encoding_format' must be 'float' or 'base64', got {quoted_value(encoding)}"
        )
    for key, value in document.items():
        if key not in ("model", "input", "encoding_format", *_CALLER_KEYS) and value is not None:
            raise OptionError(key, f"unsupported option '{key}' for embeddings")
    return EmbeddingRequest(model, texts, encoding == "base64")


def _generation_request(document: dict[str, Any], content_keys: tuple[str, ...]) -> GenerationRequest:
    request = GenerationRequest(_model(document))
    stream = document.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise OptionError("stream", f"'stream' must be true or false, got {quoted_value(stream)}")
    request.stream = bool(stream)
    stream_options = document.get("stream_options")
    if stream_options is not None:
        if not isinstance(stream_options, dict) or not request.stream:
            raise OptionError(
                "stream_options", "'stream_options' is an object, and only for streamed requests"
            )
        usage = stream_options.get("include_usage", False)
        if not isinstance(usage, bool):
            raise OptionError("stream_options", "'stream_options.include_usage' must be true or false")
        request.include_usage = usage
    n = document.get("n")
    if n is not None:
        if type(n) is not int or not 1 <= n <= MAX_CHOICES:
            raise OptionError("n", f"'n' must be an integer from 1 to {MAX_CHOICES}, got {quoted_value(n)}")
        request.n = n
    handled = {"model", "stream", "stream_options", "n", *content_keys, *_CALLER_KEYS}
    for key, value in document.items():
        if key not in handled and value is not None:  # null means the default in OpenAI's API
            request.options[key] = _check_option(key, value)
    return request


def _model(document: dict[str, Any]) -> str:
    model = document.get("model")
    if not isinstance(model, str) or not model:
        raise OptionError("model", "'model' is required: the name of a model (GET /v1/models lists them)")
    return model


def _prompt(prompt: Any) -> str:
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(item, str) for item in prompt):
        raise OptionError("prompt", f"one prompt per request: got {len(prompt)}")
    raise OptionError("prompt", "'prompt' is required and must be a string (token arrays are not supported)")


def _messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise OptionError("messages", "'messages' is required: a non-empty array of message objects")
    checked = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise OptionError("messages", f"{where} must be an object with 'role' and 'content'")
        role = message.get("role")
        if role not in _ROLES:
            raise OptionError(
                "messages", f"{where}.role must be one of {', '.join(_ROLES)}; got {quoted_value(role)}"
            )
        calls = message.get("tool_calls")
        if calls is not None and not (isinstance(calls, list) and all(isinstance(c, dict) for c in calls)):
            raise OptionError("messages", f"{where}.tool_calls must be an array of tool call objects")
        checked.append({**message, "content": _content(message.get("content"), where, role)})
    return checked


def _content(content: Any, where: str, role: str) -> str:
    """A message's content as text: a string, or the text parts of an array joined."""
    if isinstance(content, str):
        return content
    if content is None and role == "assistant":  # an assistant turn that only called tools
        return ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                kind = part.get("type") if isinstance(part, dict) else None
                raise OptionError(
                    "messages",
                    f"{where}.content: only text parts are supported (got a part of type "
                    f"{quoted_value(kind)})",
                )
            texts.append(part["text"])
        return "".join(texts)
    raise OptionError("messages", f"{where}.content must be a string or an array of text parts")


def _number(key: str, value: Any, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise OptionError(key, f"'{key}' must be a number, got {quoted_value(value)}")
    if not low <= value <= high:
        raise OptionError(key, f"'{key}' must be between {low:g} and {high:g}, got {value}")
    return value


def _check_option(key: str, value: Any) -> Any:
    """Checks a well-known option against OpenAI's type and range; other options pass as they are."""
    if key in ("max_tokens", "max_completion_tokens"):
        if type(value) is not int or value <= 0:
            raise OptionError(key, f"'{key}' must be a positive integer, got {quoted_value(value)}")
    elif key == "temperature":
        _number(key, value, 0.0, 2.0)
    elif key == "top_p":
        _number(key, value, 0.0, 1.0)
    elif key in ("frequency_penalty", "presence_penalty"):
        _number(key, value, -2.0, 2.0)
    elif key == "seed":
        if type(value) is not int:
            raise OptionError(key, f"'seed' must be an integer, got {quoted_value(value)}")
    elif key == "stop":
        stops = [value] if isinstance(value, str) else value
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise OptionError(key, "'stop' must be a string or an array of non-empty strings")
        if len(stops) > _MAX_STOP_SEQUENCES:
            raise OptionError(key, f"'stop' takes at most {_MAX_STOP_SEQUENCES} sequences, got {len(stops)}")
        return stops
    return value
