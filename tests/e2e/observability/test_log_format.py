"""Log entries in the form Triton 2.51 documents ("Logging Formats" of its logging extension),
checked with the patterns of Triton's own QA (L0_logging): `<level><date> <pid> <file>:<line>]
<message>`, the message JSON-encoded unless TRITON_SERVER_ESCAPE_LOG_MESSAGES=0, the start-up
tables (backends, models, options) each one multi-line entry, and a Python model's lines named by
its own file and line."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerProcess

ENTRY = re.compile(
    r"^(?P<level>[EWI])\d{4} \d{2}:\d{2}:\d{2}\.\d{6} \d+ (?P<file>[\w\.]+):(?P<line>\d+)\] (?P<message>.*)$"
)
ISO_ENTRY = re.compile(
    r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z (?P<level>[EWI]) \d+ (?P<file>[\w\.]+):(?P<line>\d+)\] (?P<message>.*)$"
)
TABLE_LINE = re.compile(r"^(\+[-+]+\+|\| .* \|)$")
CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
# Logs a text that an unescaped log would split, quote and colour (Triton's QA injects the same kind).
TALKING = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        pb_utils.Logger.log_warn(TEXT)
        return [pb_utils.InferenceResponse([pb_utils.get_input_tensor_by_name(r, "IN")]) for r in requests]
"""
TEXT = 'said "hi"\nI0205 18:34:18.707423 1 file.cc:123] forged entry \x1b[31mred\x1b[0m'
BROKEN = 'class TritonPythonModel:\n    def initialize(self, args):\n        raise RuntimeError("first\\nsecond")\n'


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("log-format")
    for name, body in (("talking", TALKING.replace("TEXT", repr(TEXT))), ("broken", BROKEN)):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(CONFIG)
        (root / name / "1" / "model.py").write_text(body)
    return root


def _served(repository: Path, args: list[str], env: dict[str, str]) -> Iterator[ServerProcess]:
    process = ServerProcess([repository], ["--exit-on-error=false", *args], env)
    process.start(timeout=120)
    try:
        with httpclient.InferenceServerClient(process.http_url, network_timeout=60) as client:
            tensor = httpclient.InferInput("IN", [1], "INT32")
            tensor.set_data_from_numpy(np.array([7], np.int32))
            client.infer("talking", [tensor])
        deadline = time.monotonic() + 30
        while "forged" not in process.log:
            assert time.monotonic() < deadline, "the model's line did not reach the log"
            time.sleep(0.05)
        yield process
    finally:
        process.close()


@pytest.fixture(scope="module")
def escaped(repository: Path) -> Iterator[ServerProcess]:
    yield from _served(repository, [], {})


def _entries(log: str, pattern: re.Pattern[str]) -> list[tuple[re.Match[str], list[str]]]:
    """Each entry with the lines that follow it (a multi-line entry's object); every line of the
    log is an entry's or follows one."""
    entries: list[tuple[re.Match[str], list[str]]] = []
    for line in log.splitlines():
        if (match := pattern.match(line)) is not None:
            entries.append((match, []))
        else:
            assert entries, f"the log starts with a line that is no entry: {line!r}"
            entries[-1][1].append(line)
    return entries


def test_every_entry_is_one_line_with_its_message_json_encoded_but_the_table(escaped: ServerProcess) -> None:
    entries = _entries(escaped.log, ENTRY)
    tables = [following for _, following in entries if following]
    # The start-up tables (backends, models, options), as Triton's, are the only entries over lines.
    assert [table[1].split()[1] for table in tables] == ["Backend", "Model", "Option"]
    assert all(TABLE_LINE.match(line) for table in tables for line in table)
    models = tables[1]
    assert any(re.match(r"^\| broken\s+\| 1\s+\| UNAVAILABLE: ", line) for line in models)
    assert any(re.match(r"^\|\s+\|\s+\| second\s+\|$", line) for line in models)  # its own column
    for match, following in entries:
        message = match["message"]
        if following:
            assert message == ""  # the table's heading: none, as Triton's
        else:
            assert isinstance(json.loads(message), str), message


def test_a_models_line_names_its_file_and_line_and_keeps_its_text(escaped: ServerProcess) -> None:
    [line] = [match for match, _ in _entries(escaped.log, ENTRY) if "forged" in match["message"]]
    assert (line["level"], line["file"], line["line"]) == ("W", "model.py", "6")
    assert json.loads(line["message"]) == TEXT


def test_a_load_error_of_several_lines_is_one_entry(escaped: ServerProcess) -> None:
    errors = [
        json.loads(match["message"]) for match, _ in _entries(escaped.log, ENTRY) if match["level"] == "E"
    ]
    assert any(
        e.startswith("failed to load 'broken' version 1: ") and "RuntimeError: first\nsecond" in e
        for e in errors
    )


def test_unescaped_messages_when_the_environment_says_0_and_iso8601_dates(repository: Path) -> None:
    for process in _served(repository, ["--log-format=ISO8601"], {"TRITON_SERVER_ESCAPE_LOG_MESSAGES": "0"}):
        entries = _entries(process.log, ISO_ENTRY)
        [(line, following)] = [(match, rest) for match, rest in entries if "said" in match["message"]]
        assert (line["level"], line["file"], line["message"]) == ("W", "model.py", 'said "hi"')
        # Unescaped, the model's text runs on over lines, as it would on Triton.
        assert following == [TEXT.split("\n")[1]]


def test_verbose_entries_of_http_requests_and_a_refusal_that_cannot_forge_an_entry(repository: Path) -> None:
    """At --log-verbose 1, as Triton: each HTTP request (`HTTP request: <libevhtp's method number>
    <path>`), a refusal before any model with its reason, and the stop's first words."""
    process = ServerProcess([repository], ["--exit-on-error=false", "--log-verbose=1"]).start(timeout=120)
    try:
        with httpclient.InferenceServerClient(process.http_url, network_timeout=60) as client:
            assert client.is_server_live()
            forged = httpclient.InferInput("\nI0205 18:34:18.707423 1 file.cc:123] forged", [1], "INT32")
            forged.set_data_from_numpy(np.array([7], np.int32))
            with pytest.raises(InferenceServerException):
                client.infer("talking", [forged])
        process.stop()
        messages = [
            json.loads(match["message"]) for match, _ in _entries(process.log, ENTRY) if match["message"]
        ]
    finally:
        process.close()
    assert "HTTP request: 0 /v2/health/live" in messages
    assert "HTTP request: 2 /v2/models/talking/infer" in messages
    [refused] = [message for message in messages if message.startswith("HTTP request POST")]
    assert "forged" in refused and refused.startswith(
        "HTTP request POST /v2/models/talking/infer failed: 400 "
    )
    assert "Waiting for in-flight requests to complete." in messages
    # The models' lifecycle in Triton's words (its QA counts them).
    assert messages.count("successfully loaded 'talking'") == 1
    assert messages.count("successfully unloaded 'talking' version 1") == 1
