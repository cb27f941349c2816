"""The OpenAI frontend with the real `openai` client: models, completions, chat, embeddings.

The server runs `charlm`, a decoupled Python model over a character n-gram language model
trained by the fixture (one token per character, one response per token), and `embedder`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import openai
import pytest

from coreserve.testing import ServerProcess
from support.servers.openai_repository import openai_repository, openai_url
from support.waiting import wait_until
from support.wire.http_raw import request

PROMPT = "The server reads"
# What charlm's chat template (tokenizer_config.json) makes of SYSTEM_AND_USER.
SYSTEM_AND_USER = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
RENDERED = "<s>[system] Be brief.\n[user] Hello\n[assistant] "


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repository = openai_repository(tmp_path_factory.mktemp("openai"))
    process = ServerProcess([repository], ["--openai-port=0"]).start()
    yield process
    process.close()


@pytest.fixture(scope="module")
def base_url(server: ServerProcess) -> str:
    return openai_url(server)


@pytest.fixture
def client(base_url: str) -> Iterator[openai.OpenAI]:
    # No retries: a failure must show, not be retried away.
    with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60) as client:
        yield client


# Each test leaves no traceback in the server's log (tests/e2e/conftest.py).
pytestmark = pytest.mark.usefixtures("no_traceback")


def _metric(server: ServerProcess, name: str, **labels: str) -> float:
    """The sample of `name` with exactly these labels (0 when there is none yet)."""
    with urllib.request.urlopen(server.metrics_url, timeout=30) as reply:
        text = reply.read().decode()
    for line in text.splitlines():
        found = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if found and dict(re.findall(r'(\w+)="([^"]*)"', found.group(1))) == labels:
            return float(found.group(2))
    return 0.0


def test_models_lists_the_ready_models(client: openai.OpenAI, base_url: str) -> None:
    assert request(urlsplit(base_url).netloc, "GET", "/health/ready")[0] == 200  # as Triton's frontend
    models = client.models.list().data
    assert [model.id for model in models] == ["charlm", "embedder"]
    assert all(
        model.object == "model" and model.owned_by == "coreserve" and model.created > 0 for model in models
    )
    assert client.models.retrieve("charlm").id == "charlm"


def test_a_completion_takes_the_sampling_options(client: openai.OpenAI) -> None:
    first = client.completions.create(model="charlm", prompt=PROMPT, max_tokens=24, seed=7, temperature=1.5)
    again = client.completions.create(model="charlm", prompt=PROMPT, max_tokens=24, seed=7, temperature=1.5)
    other = client.completions.create(model="charlm", prompt=PROMPT, max_tokens=24, seed=8, temperature=1.5)
    text = first.choices[0].text
    assert len(text) == 24 and again.choices[0].text == text  # the seed reached the model
    assert other.choices[0].text != text
    assert first.object == "text_completion" and first.model == "charlm" and first.id.startswith("cmpl-")
    assert first.choices[0].finish_reason == "length"
    assert first.usage is not None
    assert (first.usage.prompt_tokens, first.usage.completion_tokens) == (len(PROMPT), 24)
    assert first.usage.total_tokens == len(PROMPT) + 24
    greedy = {client.completions.create(model="charlm", prompt=PROMPT, max_tokens=12, temperature=0).choices[0].text
              for _ in range(2)}  # fmt: skip
    assert len(greedy) == 1


def test_a_stop_sequence_ends_the_completion(client: openai.OpenAI) -> None:
    whole = client.completions.create(model="charlm", prompt=PROMPT, max_tokens=40, temperature=0)
    text = whole.choices[0].text
    stop = text[
        10:12
    ]  # greedy decoding writes the same text again, and meets this at character 10 at the latest
    stopped = client.completions.create(
        model="charlm", prompt=PROMPT, max_tokens=40, temperature=0, stop=[stop]
    )
    assert stopped.choices[0].text == text[: text.index(stop)]
    assert stopped.choices[0].finish_reason == "stop"


def test_a_streamed_completion_sends_a_chunk_per_token(client: openai.OpenAI) -> None:
    whole = client.completions.create(model="charlm", prompt=PROMPT, max_tokens=20, seed=3)
    chunks = list(
        client.completions.create(model="charlm", prompt=PROMPT, max_tokens=20, seed=3, stream=True)
    )
    texts = [chunk.choices[0].text for chunk in chunks]
    assert "".join(texts) == whole.choices[0].text
    assert len([text for text in texts if text]) == 20
    assert [chunk.choices[0].finish_reason for chunk in chunks][-1] == "length"
    assert len({chunk.id for chunk in chunks}) == 1


def test_chat_renders_the_model_template(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(model="charlm", messages=SYSTEM_AND_USER, max_tokens=15, seed=5)
    reference = client.completions.create(model="charlm", prompt=RENDERED, max_tokens=15, seed=5)
    message = answer.choices[0].message
    assert message.role == "assistant" and message.content == reference.choices[0].text
    assert answer.object == "chat.completion" and answer.id.startswith("chatcmpl-")
    assert answer.usage is not None and answer.usage.prompt_tokens == len(RENDERED)
    # max_completion_tokens is the newer name of max_tokens.
    newer = client.chat.completions.create(
        model="charlm", messages=SYSTEM_AND_USER, max_completion_tokens=15, seed=5
    )
    assert newer.choices[0].message.content == message.content


def test_a_streamed_chat_opens_with_the_role_and_ends_with_the_usage(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="charlm", messages=SYSTEM_AND_USER, max_tokens=10, seed=5, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (len(RENDERED), 10)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks[:-1])
    whole = client.chat.completions.create(model="charlm", messages=SYSTEM_AND_USER, max_tokens=10, seed=5)
    assert text == whole.choices[0].message.content


def test_a_seed_at_the_top_of_its_range_counts_down_for_the_other_choices(client: openai.OpenAI) -> None:
    top = 2**64 - 1  # charlm's seed input is UINT64
    whole = client.completions.create(model="charlm", prompt=PROMPT, max_tokens=6, seed=top, n=2)
    singles = [
        client.completions.create(model="charlm", prompt=PROMPT, max_tokens=6, seed=top - index)
        .choices[0]
        .text
        for index in range(2)
    ]
    assert [choice.text for choice in whole.choices] == singles


def test_n_choices_are_n_requests_seeded_apart(client: openai.OpenAI) -> None:
    whole = client.completions.create(model="charlm", prompt=PROMPT, max_tokens=12, seed=40, n=3)
    assert [choice.index for choice in whole.choices] == [0, 1, 2]
    singles = [
        client.completions.create(model="charlm", prompt=PROMPT, max_tokens=12, seed=40 + index)
        .choices[0]
        .text
        for index in range(3)
    ]
    assert [choice.text for choice in whole.choices] == singles  # choice i samples with seed + i
    assert whole.usage is not None
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (len(PROMPT), 36)  # the prompt once
    chunks = list(
        client.chat.completions.create(
            model="charlm", messages=SYSTEM_AND_USER, max_tokens=8, seed=40, n=3, stream=True
        )
    )
    texts = {index: "" for index in range(3)}
    roles, finished = [], []
    for chunk in chunks:
        (choice,) = chunk.choices
        texts[choice.index] += choice.delta.content or ""
        roles += [choice.index] if choice.delta.role == "assistant" else []
        finished += [choice.index] if choice.finish_reason == "length" else []
    assert sorted(roles) == sorted(finished) == [0, 1, 2]  # each choice opens with its role and ends
    whole_chat = client.chat.completions.create(
        model="charlm", messages=SYSTEM_AND_USER, max_tokens=8, seed=40, n=3
    )
    assert [texts[index] for index in range(3)] == [c.message.content for c in whole_chat.choices]


def test_the_async_client_streams_many_at_once(base_url: str, client: openai.OpenAI) -> None:
    seeds = range(8)

    async def stream_all() -> list[str]:
        async with openai.AsyncOpenAI(
            base_url=base_url, api_key="unused", max_retries=0, timeout=60
        ) as aclient:

            async def one(seed: int) -> str:
                stream = await aclient.completions.create(
                    model="charlm", prompt=PROMPT, max_tokens=30, seed=seed, stream=True
                )
                return "".join([chunk.choices[0].text async for chunk in stream])

            return await asyncio.gather(*(one(seed) for seed in seeds))

    streamed = asyncio.run(stream_all())
    expected = [
        client.completions.create(model="charlm", prompt=PROMPT, max_tokens=30, seed=seed).choices[0].text
        for seed in seeds
    ]
    assert streamed == expected


def test_embeddings(client: openai.OpenAI) -> None:
    texts = ["a model", "a server", "batches of requests"]
    answer = client.embeddings.create(model="embedder", input=texts)
    vectors = np.array([item.embedding for item in answer.data])
    assert vectors.shape == (3, 16) and [item.index for item in answer.data] == [0, 1, 2]
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert answer.usage.prompt_tokens == sum(len(text) for text in texts)
    alone = client.embeddings.create(model="embedder", input=texts[1]).data[0].embedding
    assert np.allclose(alone, vectors[1])
    # The openai client asks for base64 and decodes it itself; the raw answer is float32 bytes.
    raw = client.embeddings.with_raw_response.create(
        model="embedder", input=texts[1], encoding_format="base64"
    )
    encoded = raw.http_response.json()["data"][0]["embedding"]
    assert np.allclose(np.frombuffer(base64.b64decode(encoded), "<f4"), vectors[1])


def test_metrics_count_tokens_and_time_them(server: ServerProcess, client: openai.OpenAI) -> None:
    labels = {"model": "charlm", "version": "1"}

    def read() -> dict[str, float]:
        return {
            name: _metric(server, f"coreserve_openai_{name}", **labels)
            for name in ("time_to_first_token_seconds_count", "inter_token_latency_seconds_count",
                         "prompt_tokens_total", "generation_tokens_total")
        }  # fmt: skip

    before = read()
    list(client.completions.create(model="charlm", prompt=PROMPT, max_tokens=9, seed=1, stream=True))
    client.completions.create(model="charlm", prompt=PROMPT, max_tokens=5, seed=1)
    after = read()
    assert after["time_to_first_token_seconds_count"] - before["time_to_first_token_seconds_count"] == 2
    assert after["inter_token_latency_seconds_count"] - before["inter_token_latency_seconds_count"] == 8 + 4
    assert after["prompt_tokens_total"] - before["prompt_tokens_total"] == 2 * len(PROMPT)
    assert after["generation_tokens_total"] - before["generation_tokens_total"] == 14
    assert _metric(server, "coreserve_openai_time_to_first_token_seconds_bucket", **labels, le="+Inf") > 0


# What charlm logs for each choice's request that stops because it was cancelled, and how many
# tokens it had sent: anything short of 100,000 (200 s at 2 ms a token) means it stopped for
# that reason, not because it was done.
STOPPED = re.compile(r"charlm stopped after (\d+) of 100000 tokens: cancelled")


@pytest.mark.parametrize("n", [1, 2])
def test_a_client_that_closes_the_stream_stops_the_model(
    server: ServerProcess, client: openai.OpenAI, n: int
) -> None:
    stopped_before = len(STOPPED.findall(server.log))
    cancelled_before = _metric(
        server, "nv_inference_request_failure", model="charlm", reason="CANCELED", version="1"
    )
    stream = client.completions.create(
        model="charlm", prompt=PROMPT, max_tokens=100_000, stream=True, n=n, extra_body={"token_delay_ms": 2}
    )
    received = 0
    for chunk in stream:
        received += bool(chunk.choices[0].text)
        if received == 20 * n:
            break
    assert len(STOPPED.findall(server.log)) == stopped_before  # still generating as its client closes
    stream.close()
    wait_until(lambda: len(STOPPED.findall(server.log)) >= stopped_before + n, "each choice's request stops")
    stopped = STOPPED.findall(server.log)[stopped_before:]
    # Each stopped by the cancellation, long before its end.
    assert len(stopped) == n and all(int(sent) < 100_000 for sent in stopped)
    wait_until(
        lambda: (
            _metric(server, "nv_inference_request_failure", model="charlm", reason="CANCELED", version="1")
            == cancelled_before + n
        ),
        "the requests are counted as cancelled",
    )
    # The instances they held serve again.
    assert client.completions.create(model="charlm", prompt=PROMPT, max_tokens=3, n=2).usage is not None


def test_requests_are_traced_as_the_data_planes(tmp_path: Path) -> None:
    trace_file = tmp_path / "trace.json"
    args = ["--openai-port=0", "--trace-config", f"triton,file={trace_file}", "--trace-config", "level=TIMESTAMPS",
            "--trace-config", "rate=1"]  # fmt: skip
    process = ServerProcess([openai_repository(tmp_path / "models")], args).start()
    try:
        with openai.OpenAI(
            base_url=openai_url(process), api_key="unused", max_retries=0, timeout=60
        ) as client:
            list(client.completions.create(model="charlm", prompt=PROMPT, max_tokens=4, stream=True))
            client.embeddings.create(model="embedder", input=["a", "b"])
        assert process.stop() == 0
        entries = json.loads(trace_file.read_text())
    finally:
        process.close()
    models: dict[int, str] = {}
    marks: dict[int, list[str]] = {}
    for entry in entries:
        if "model_name" in entry:
            models[entry["id"]] = entry["model_name"]
        for stamp in entry.get("timestamps", []):
            marks.setdefault(entry["id"], []).append(stamp["name"])
    assert sorted(models.values()) == ["charlm", "embedder", "embedder"]
    for names in marks.values():
        assert names[0] == "REQUEST_START" and names[-1] == "REQUEST_END" and "COMPUTE_START" in names
