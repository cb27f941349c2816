"""README's two set-up commands stay true: CI runs the test command word for word."""

from __future__ import annotations

import re

from paths import REPO


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
