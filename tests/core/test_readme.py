"""README stays true: CI runs the test command word for word, and the in-process example runs."""

from __future__ import annotations

import re

import pytest

from support.paths import REPO


def _commands() -> list[str]:
    readme = (REPO / "README.md").read_text()
    quick_start = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```\n(.+?)\n```", quick_start)


def test_quick_start_has_two_commands_and_ci_runs_the_test_command() -> None:
    serve, test = _commands()
    assert "coreserve --model-repository examples/model_repository" in serve
    assert "pytest" in test
    ci_lines = (REPO / ".ci" / "run").read_text().splitlines()
    assert test in ci_lines


def test_example_models_of_the_readme_exist() -> None:
    readme = (REPO / "README.md").read_text()
    for name in re.findall(r"^\| `(\w+)` \|", readme, flags=re.M):
        assert (REPO / "examples" / "model_repository" / name / "1").is_dir(), name


def test_the_in_process_example_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    readme = (REPO / "README.md").read_text()
    section = readme.split("## In-process API", 1)[1].split("\n## ", 1)[0]
    example = re.findall(r"```python\n(.+?)\n```", section, flags=re.S)[0]
    monkeypatch.chdir(REPO)  # the example names examples/model_repository as a user's clone would
    exec(compile(example, "README.md (In-process API)", "exec"), {})
    printed = capsys.readouterr().out
    assert "[[ 1  2  3" in printed  # OUTPUT0 = INPUT0 + 1
    assert "True 8" in printed  # ready, and the eight example models


def _anchor(heading: str) -> str:
    """The id MkDocs (and GitHub) gives a heading: lower case, punctuation dropped, spaces as dashes."""
    return re.sub(r"\s+", "-", re.sub(r"[^\w\s-]", "", heading.lower()).strip())


def test_the_links_of_the_readme_lead_to_pages_and_headings_that_exist() -> None:
    readme = (REPO / "README.md").read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#([^)\s]+))?\)", readme)
    local = [(path, anchor) for path, anchor in links if "://" not in path]
    assert len(local) >= 20  # the feature table and the pointers into docs/
    for path, anchor in local:
        target = REPO / path
        assert target.is_file(), f"README links to {path}, which does not exist"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", target.read_text(), flags=re.M)
            assert anchor in {_anchor(h) for h in headings}, f"{path} has no heading for #{anchor}"
