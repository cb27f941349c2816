"""Chat templates: a model's messages rendered to one prompt, as Hugging Face's tokenizers do.

The template is Jinja2 in Hugging Face's format. It comes from the model's configuration
parameter `chat_template` (the template's text), or else from the `chat_template` of a
`tokenizer_config.json` in the model's folder (where `bos_token` and `eos_token` are read too).
Templates run in Jinja2's immutable sandbox, as `transformers` runs them: a template is data
from a model folder, and must not reach the server's objects.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from coreserve.config import ModelConfig
from coreserve.errors import InvalidArgumentError

CONFIG_PARAMETER = "chat_template"
TOKENIZER_CONFIG = "tokenizer_config.json"


class TemplateError(InvalidArgumentError):
    """A model's chat template is missing, malformed, or refused the messages."""


def _raise_exception(message: str) -> None:
    # Hugging Face's templates call raise_exception() to refuse messages they cannot render.
    raise TemplateError(f"the model's chat template refused the messages: {message}")


def _environment() -> ImmutableSandboxedEnvironment:
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    environment.globals["raise_exception"] = _raise_exception
    return environment


class ChatTemplate:
    """One model's compiled template, with the special tokens it may use."""

    def __init__(self, source: str, tokens: Mapping[str, str], environment: jinja2.Environment) -> None:
        try:
            self._template = environment.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(f"the model's chat template is malformed: {exc}") from None
        self._tokens = dict(tokens)

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        try:
            return self._template.render(
                messages=messages, add_generation_prompt=add_generation_prompt, **self._tokens
            )
        except TemplateError:
            raise
        except jinja2.TemplateError as exc:
            raise TemplateError(f"the model's chat template failed on these messages: {exc}") from None
        except Exception as exc:  # the template's own code on the client's values (a number it iterates)
            raise TemplateError(
                f"the model's chat template failed on these messages: {type(exc).__name__}: {exc}"
            ) from None


class ChatTemplates:
    """The chat template of each model version, read and compiled on first use."""

    def __init__(self) -> None:
        self._environment = _environment()
        # Per model version, the config it was read for: a reloaded version has a new one.
        self._templates: dict[tuple[str, int], tuple[ModelConfig, ChatTemplate]] = {}

    def template(self, name: str, version: int, config: ModelConfig, folder: Path | None) -> ChatTemplate:
        found = self._templates.get((name, version))
        if found is not None and found[0] is config:
            return found[1]
        template = self._load(name, config, folder)
        self._templates[(name, version)] = (config, template)
        return template

    def _load(self, name: str, config: ModelConfig, folder: Path | None) -> ChatTemplate:
        tokens: dict[str, str] = {}
        source: object = None  # a string, or a list of named templates from tokenizer_config.json
        parameter = config.parameters.get(CONFIG_PARAMETER)
        if parameter is not None and parameter.string_value.strip():
            source = parameter.string_value
        settings = _tokenizer_config(folder / TOKENIZER_CONFIG) if folder is not None else {}
        for token in ("bos_token", "eos_token"):
            value = settings.get(token)
            if isinstance(value, dict):  # an AddedToken written out: {"content": "<s>", ...}
                value = value.get("content")
            if isinstance(value, str):
                tokens[token] = value
        if source is None:
            source = settings.get("chat_template")
        if isinstance(source, list):  # named templates: [{"name": "default", "template": "..."}]
            named = {item.get("name"): item.get("template") for item in source if isinstance(item, dict)}
            source = named.get("default")
        if not isinstance(source, str) or not source.strip():
            raise TemplateError(
                f"model '{name}' has no chat template: give it a '{CONFIG_PARAMETER}' parameter or a "
                f"{TOKENIZER_CONFIG} with one in its folder (/v1/completions takes a prompt instead)"
            )
        return ChatTemplate(source, tokens, self._environment)


def _tokenizer_config(path: Path) -> dict[str, Any]:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise TemplateError(f"cannot read the model's {TOKENIZER_CONFIG}: {exc}") from None
    return document if isinstance(document, dict) else {}
