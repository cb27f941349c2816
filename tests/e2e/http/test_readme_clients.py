"""The README's client examples run, each on its own, against the example repository."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator

import pytest

from coreserve.testing import ServerProcess
from support.paths import EXAMPLES, REPO


def _section() -> str:
    readme = (REPO / "README.md").read_text()
    return readme.split("## Call it with tritonclient", 1)[1].split("\n## ", 1)[0]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    process = ServerProcess([EXAMPLES]).start(timeout=120)
    yield process
    process.close()


def _on(server: ServerProcess, code: str) -> str:
    """The example with the server's ports in place of 8000 and 8001."""
    return code.replace("localhost:8000", server.http_url).replace("localhost:8001", server.grpc_url)


def test_each_python_example_runs_on_its_own(
    server: ServerProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    blocks = re.findall(r"```python\n(.+?)\n```", _section(), flags=re.S)
    assert len(blocks) == 3  # simple over HTTP, the pipeline, simple over gRPC
    printed = []
    for index, block in enumerate(blocks):
        exec(
            compile(_on(server, block), f"README.md (client example {index + 1})", "exec"), {}
        )  # a fresh namespace
        printed.append(capsys.readouterr().out)
    assert printed[0].startswith("[[ 1  2  3")
    # The output the README says to expect from the pipeline (the weights come from a fixed seed).
    expected = re.search(r"# (\[\[b'positive'\].+?): the same on every machine", _section())
    assert expected is not None
    assert " ".join(printed[1].split()) == expected.group(1)
    assert printed[2].startswith("[[ 1  2  3")


def test_the_curl_example_answers_as_shown(server: ServerProcess) -> None:
    command = re.search(r"```\n(curl .+?)\n```", _section(), flags=re.S)
    assert command is not None
    url = re.search(r"curl -s (\S+)", command.group(1))
    body = re.search(r"-d '(.+?)'", command.group(1), flags=re.S)
    shown = re.search(r"# (\{.+?)\.\.\.", command.group(1))
    assert url and body and shown
    # What `curl -d` sends: the body as given, with curl's form content type.
    request = urllib.request.Request(
        "http://" + _on(server, url.group(1)),
        data=body.group(1).encode(),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        answer = response.read().decode()
    assert answer.startswith(shown.group(1))
    assert json.loads(answer)["outputs"][0]["data"] == list(range(1, 17))
