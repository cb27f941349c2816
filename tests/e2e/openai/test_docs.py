"""The OpenAI page's example runs as written: its serve command on the example repository, then
its `openai` client snippet, which prints what the page says it prints."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator

import pytest

from coreserve.testing import ServerProcess
from support.paths import EXAMPLES, REPO
from support.servers.openai_repository import openai_url

DOCUMENTED_URL = "http://localhost:9000/v1"


def _section() -> str:
    page = (REPO / "docs" / "openai.md").read_text()
    return page.split("## Try it on the examples", 1)[1].split("\n## ", 1)[0]


def _served_flags() -> list[str]:
    """The documented command's coreserve flags, with a free port in place of 9000 (the
    repository is given by ServerProcess, which also binds 127.0.0.1)."""
    command = re.search(r"```\n(.+?)\n```", _section(), flags=re.S)
    assert command is not None
    words = shlex.split(command.group(1).split("coreserve ", 1)[1])
    assert words[:2] == ["--model-repository", "examples/model_repository"], words
    flags = words[2:]
    assert flags == ["--openai-port", "9000"], flags
    return [word.replace("9000", "0") for word in flags]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    process = ServerProcess([EXAMPLES], _served_flags()).start(timeout=120)
    yield process
    process.close()


def test_the_documented_openai_snippet_prints_what_the_page_shows(
    server: ServerProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    block = re.search(r"```python\n(.+?)\n```", _section(), flags=re.S)
    assert block is not None
    code = block.group(1)
    assert DOCUMENTED_URL in code
    program = code.replace(DOCUMENTED_URL, openai_url(server))
    exec(compile(program, "docs/openai.md (Try it on the examples)", "exec"), {})  # a fresh namespace
    printed = capsys.readouterr().out.splitlines()
    shown = [line.removeprefix("# ") for line in code.splitlines() if line.startswith("# ")]
    assert shown == ["You said: Hello, coreserve 4", "You said: Hello, coreserve"]
    assert printed == shown
    assert "Traceback" not in server.log
