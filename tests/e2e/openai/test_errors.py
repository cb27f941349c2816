"""The OpenAI frontend's answers to bad requests: OpenAI's error format, the right statuses.

Raw HTTP (http_raw), as curl would send them; the last test checks that the `openai` client
reads these errors as its own exceptions.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import openai
import pytest

from coreserve.testing import ServerProcess
from support.servers.openai_repository import openai_repository, openai_url
from support.wire.http_raw import request

MAX_BODY = 64 * 1024
CHAT = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repository = openai_repository(tmp_path_factory.mktemp("openai"))
    process = ServerProcess([repository], ["--openai-port=0", f"--http-max-input-size={MAX_BODY}"]).start()
    yield process
    process.close()


@pytest.fixture(scope="module")
def address(server: ServerProcess) -> str:
    return urlsplit(openai_url(server)).netloc


# Each test leaves no traceback in the server's log (tests/e2e/conftest.py).
pytestmark = pytest.mark.usefixtures("no_traceback")


def _error(address: str, path: str, body: Any, method: str = "POST") -> tuple[int, dict[str, Any]]:
    """(status, the 'error' object) of a request whose body is `body` (bytes as they are, else JSON)."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    status, headers, reply = request(address, method, path, data, {"Content-Type": "application/json"})
    assert headers["Content-Type"] == "application/json"
    document = json.loads(reply)
    assert set(document) == {"error"} and set(document["error"]) == {"message", "type", "param", "code"}
    return status, document["error"]


def test_an_unknown_model_is_404_model_not_found(address: str) -> None:
    for path, body in (
        ("/v1/completions", {"model": "nope", "prompt": "x"}),
        ("/v1/chat/completions", {"model": "nope", "messages": CHAT}),
        ("/v1/embeddings", {"model": "nope", "input": "x"}),
    ):
        status, error = _error(address, path, body)
        assert (status, error["code"], error["param"]) == (404, "model_not_found", "model")
        assert "'nope' does not exist" in error["message"]
    status, error = _error(address, "/v1/models/nope", None, "GET")
    assert (status, error["code"]) == (404, "model_not_found")


def test_an_unknown_endpoint_is_404_and_a_wrong_method_405(address: str) -> None:
    status, error = _error(address, "/v1/images/generations", {})
    assert status == 404 and "unknown endpoint" in error["message"]
    status, error = _error(address, "/v1/chat/completions", None, "GET")
    assert (status, error["message"]) == (405, "Method Not Allowed")


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        (b"{not json", None, "malformed JSON"),
        (b"[1, 2]", None, "must be a JSON object"),
        ({"prompt": "x"}, "model", "'model' is required"),
        ({"model": "charlm"}, "prompt", "'prompt' is required"),
        ({"model": "charlm", "prompt": [1, 2, 3]}, "prompt", "token arrays are not supported"),
        ({"model": "charlm", "prompt": ["a", "b"]}, "prompt", "one prompt per request"),
        ({"model": "charlm", "prompt": "x", "max_tokens": 0}, "max_tokens", "positive integer"),
        ({"model": "charlm", "prompt": "x", "max_tokens": -3}, "max_tokens", "positive integer"),
        ({"model": "charlm", "prompt": "x", "max_tokens": "5"}, "max_tokens", "positive integer"),
        ({"model": "charlm", "prompt": "x", "temperature": 3}, "temperature", "between 0 and 2"),
        ({"model": "charlm", "prompt": "x", "top_p": "high"}, "top_p", "must be a number"),
        ({"model": "charlm", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
        ({"model": "charlm", "prompt": "x", "n": 0}, "n", "from 1 to 16"),
        ({"model": "charlm", "prompt": "x", "n": 17}, "n", "from 1 to 16"),
        ({"model": "charlm", "prompt": "x", "stream": "yes"}, "stream", "true or false"),
        ({"model": "charlm", "prompt": "x", "stream_options": {"include_usage": True}}, "stream_options",
         "only for streamed requests"),
        ({"model": "charlm", "prompt": "x", "seed": -1}, "seed", "outside the range of UINT64"),
    ],
)  # fmt: skip
def test_malformed_completion_requests_are_400(
    address: str, body: Any, param: str | None, words: str
) -> None:
    status, error = _error(address, "/v1/completions", body)
    assert (status, error["type"], error["param"]) == (400, "invalid_request_error", param)
    assert words in error["message"]


@pytest.mark.parametrize(
    ("messages", "words"),
    [
        (None, "'messages' is required"),
        ([], "'messages' is required"),
        (["hello"], "messages[0] must be an object"),
        ([{"role": "wizard", "content": "x"}], "messages[0].role must be one of"),
        ([{"role": "user", "content": 5}], "messages[0].content must be a string"),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
            "only text parts",
        ),
        (
            [{"role": "assistant", "content": None, "tool_calls": 5}],
            "messages[0].tool_calls must be an array",
        ),
        # The template itself refuses this role (raise_exception in tokenizer_config.json).
        ([{"role": "tool", "content": "x"}], "chat template refused the messages"),
    ],
)
def test_malformed_messages_are_400(address: str, messages: Any, words: str) -> None:
    status, error = _error(address, "/v1/chat/completions", {"model": "charlm", "messages": messages})
    assert status == 400 and words in error["message"], error


def test_an_option_the_model_cannot_take_is_400_naming_it(address: str) -> None:
    for option, value in (("frequency_penalty", 0.5), ("logit_bias", {"50256": -100}), ("logprobs", 2)):
        status, error = _error(address, "/v1/completions", {"model": "charlm", "prompt": "x", option: value})
        assert (status, error["param"]) == (400, option)
        assert f"model 'charlm' does not support option '{option}'" in error["message"]
        assert "max_tokens, seed, stop, temperature, token_delay_ms, top_p" in error["message"]
    status, error = _error(
        address,
        "/v1/chat/completions",
        {"model": "charlm", "messages": CHAT, "tools": [{"type": "function"}]},
    )
    assert (status, error["param"]) == (400, "tools")
    status, error = _error(address, "/v1/embeddings", {"model": "embedder", "input": "x", "dimensions": 8})
    assert (status, error["param"]) == (400, "dimensions")


def test_a_model_of_the_wrong_kind_is_400(address: str) -> None:
    status, error = _error(address, "/v1/completions", {"model": "embedder", "prompt": "x"})
    assert status == 400 and "model 'embedder' cannot generate text" in error["message"]
    status, error = _error(address, "/v1/embeddings", {"model": "charlm", "input": "x"})
    assert status == 400 and "model 'charlm' cannot embed text" in error["message"]


def test_oversized_prompts_and_bodies(address: str) -> None:
    # Over the model's context: the model's own error, as a 400, streamed or not.
    for stream in (False, True):
        body = {"model": "charlm", "prompt": "x" * 2001, "stream": stream}
        status, error = _error(address, "/v1/completions", body)
        assert status == 400 and "over this model's context of 2000" in error["message"]
    # Over --http-max-input-size: the HTTP server's 413, in OpenAI's format.
    status, error = _error(address, "/v1/completions", {"model": "charlm", "prompt": "x" * (MAX_BODY + 1)})
    assert status == 413 and "too large" in error["message"]


def test_a_model_fault_is_a_500_or_an_error_event_logged_once(server: ServerProcess, address: str) -> None:
    logged = len(server.log)
    body = {"model": "charlm", "prompt": "x", "max_tokens": 10, "fail_after_tokens": 3}
    status, error = _error(address, "/v1/completions", body)
    assert (status, error["type"]) == (500, "server_error")
    assert "charlm failed after 3 tokens, as asked" in error["message"]
    # Streamed, the status went out with the first token: the error is an event, then [DONE].
    data = json.dumps({**body, "stream": True}).encode()
    status, _, reply = request(address, "POST", "/v1/completions", data, {"Content-Type": "application/json"})
    events = [line[len("data: ") :] for line in reply.decode().splitlines() if line.startswith("data: ")]
    assert status == 200 and events[-1] == "[DONE]"
    assert "charlm failed after 3 tokens" in json.loads(events[-2])["error"]["message"]
    assert "".join(json.loads(event)["choices"][0]["text"] for event in events[:-2]) != ""
    lines = [line for line in server.log[logged:].splitlines() if "charlm failed after 3 tokens" in line]
    assert len(lines) == 2 and all("OpenAI frontend:" in line for line in lines), lines


def test_the_openai_client_reads_these_errors(server: ServerProcess) -> None:
    with openai.OpenAI(base_url=openai_url(server), api_key="unused", max_retries=0, timeout=60) as client:
        with pytest.raises(openai.NotFoundError) as missing:
            client.completions.create(model="nope", prompt="x")
        assert missing.value.code == "model_not_found"
        with pytest.raises(openai.BadRequestError) as bad:
            client.completions.create(model="charlm", prompt="x", max_tokens=0)
        assert bad.value.param == "max_tokens" and "positive integer" in bad.value.message
        # The server goes on serving.
        assert client.completions.create(model="charlm", prompt="x", max_tokens=2).choices[0].text


def test_without_the_extra_the_port_is_one_start_up_error(tmp_path: Path) -> None:
    # A jinja2 that cannot be imported stands for an install without core-server[openai].
    (tmp_path / "jinja2").mkdir()
    (tmp_path / "jinja2" / "__init__.py").write_text("raise ImportError('No module named jinja2')\n")
    repository = openai_repository(tmp_path / "models")
    process = ServerProcess([repository], ["--openai-port=0"], env={"PYTHONPATH": str(tmp_path)})
    try:
        with pytest.raises(RuntimeError, match="exited with 1"):
            process.start()
        lines = process.log.splitlines()
        errors = [line for line in lines if line.startswith("E")]
        assert len(errors) == 1
        assert (
            "--openai-port needs the OpenAI frontend's extra: pip install 'core-server[openai]' (from a clone: "
            "pip install './core[openai]')" in errors[0]
        )
        assert lines.index(errors[0]) < next(i for i, line in enumerate(lines) if "coreserve stopped" in line)
        assert "Traceback" not in process.log
    finally:
        process.close()


def test_compressed_bodies_are_read_and_those_too_large_once_inflated_are_413(address: str) -> None:
    """A gzip body is read as the REST frontend reads it; past --http-max-input-size once inflated
    it is 413, whether it is inflated on the loop (small) or on a codec thread (from 16 KiB)."""
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    body = json.dumps({"model": "charlm", "prompt": "Hello", "max_tokens": 2, "seed": 7}).encode()
    status, _, reply = request(address, "POST", "/v1/completions", gzip.compress(body), headers)
    assert status == 200, reply
    assert json.loads(reply)["object"] == "text_completion"
    for bomb in (gzip.compress(b" " * (4 * MAX_BODY)), gzip.compress(os.urandom(2 * MAX_BODY))):
        status, _, reply = request(address, "POST", "/v1/completions", bomb, headers)
        assert status == 413, (len(bomb), reply)
        assert "too large" in json.loads(reply)["error"]["message"]
