"""Chat templates: where a model's template comes from, what it may reach, how it fails."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from google.protobuf import text_format

from coreserve.protos import model_config_pb2
from coreserve.server.openai._chat_template import ChatTemplates, TemplateError

MESSAGES = [{"role": "user", "content": "Hi"}]


def _config(text: str = "") -> model_config_pb2.ModelConfig:
    return text_format.Parse(f'name: "m" backend: "python" {text}', model_config_pb2.ModelConfig())


def _folder(tmp_path: Path, settings: dict[str, object]) -> Path:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(settings))
    return tmp_path


def test_the_tokenizer_config_gives_the_template_and_its_tokens(tmp_path: Path) -> None:
    folder = _folder(
        tmp_path,
        {
            "bos_token": {"content": "<s>", "lstrip": False},  # an AddedToken written out
            "eos_token": "</s>",
            "chat_template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}"
            "{% if add_generation_prompt %}>{% endif %}",
        },
    )
    template = ChatTemplates().template("m", 1, _config(), folder)
    assert template.render(MESSAGES) == "<s>Hi</s>>"
    assert template.render(MESSAGES, add_generation_prompt=False) == "<s>Hi</s>"


def test_the_config_parameter_comes_before_the_tokenizer_config(tmp_path: Path) -> None:
    folder = _folder(tmp_path, {"chat_template": "from the file", "eos_token": "</s>"})
    config = _config('parameters { key: "chat_template" value { string_value: "param {{ eos_token }}" } }')
    assert ChatTemplates().template("m", 1, config, folder).render(MESSAGES) == "param </s>"


def test_named_templates_use_the_default_one(tmp_path: Path) -> None:
    folder = _folder(
        tmp_path,
        {
            "chat_template": [
                {"name": "tool_use", "template": "tools"},
                {"name": "default", "template": "plain"},
            ]
        },
    )
    assert ChatTemplates().template("m", 1, _config(), folder).render(MESSAGES) == "plain"


def test_a_model_without_a_template_is_refused_with_the_way_to_give_one(tmp_path: Path) -> None:
    with pytest.raises(
        TemplateError, match="model 'm' has no chat template: give it a 'chat_template' parameter"
    ):
        ChatTemplates().template("m", 1, _config(), tmp_path)


def test_the_sandbox_keeps_templates_away_from_python_objects(tmp_path: Path) -> None:
    # A template is data from a model folder: it must not reach classes, globals or mutate its input.
    folder = _folder(tmp_path, {"chat_template": "{{ messages.__class__.__mro__[1].__subclasses__() }}"})
    with pytest.raises(TemplateError, match="failed on these messages"):
        ChatTemplates().template("m", 1, _config(), folder).render(MESSAGES)
    folder = _folder(tmp_path, {"chat_template": "{{ messages.append(1) }}"})
    with pytest.raises(TemplateError, match="failed on these messages"):
        ChatTemplates().template("m", 2, _config(), folder).render(MESSAGES)


def test_raise_exception_refuses_the_messages_and_syntax_errors_are_named(tmp_path: Path) -> None:
    folder = _folder(tmp_path, {"chat_template": "{{ raise_exception('only user turns') }}"})
    with pytest.raises(TemplateError, match="refused the messages: only user turns"):
        ChatTemplates().template("m", 1, _config(), folder).render(MESSAGES)
    folder = _folder(tmp_path, {"chat_template": "{% for m in messages %}"})
    with pytest.raises(TemplateError, match="chat template is malformed"):
        ChatTemplates().template("m", 2, _config(), folder)


def test_a_template_that_fails_on_the_clients_values_is_the_clients_error(tmp_path: Path) -> None:
    """A template's own code (looping over a field a client sent as a number) raises whatever
    Python raises: the client's request is refused, not the server's fault."""
    folder = _folder(
        tmp_path, {"chat_template": "{% for m in messages %}{% for c in m.calls %}{% endfor %}{% endfor %}"}
    )
    template = ChatTemplates().template("m", 1, _config(), folder)
    with pytest.raises(
        TemplateError, match="failed on these messages: TypeError: 'int' object is not iterable"
    ):
        template.render([{"role": "user", "content": "Hi", "calls": 5}])
