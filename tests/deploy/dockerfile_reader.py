"""A Dockerfile read as its instructions, for the image recipe's tests (hadolint does the linting)."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Instruction:
    """One instruction: its keyword in capitals and the rest of its (joined) lines."""

    keyword: str
    arguments: str

    def words(self) -> list[str]:
        """The arguments as the builder splits them: JSON (exec form) or shell words."""
        if self.arguments.startswith("["):
            parsed: list[str] = json.loads(self.arguments)
            return parsed
        return shlex.split(self.arguments)


def instructions(dockerfile: Path) -> list[Instruction]:
    """The instructions in order; comments dropped, backslash-continued lines joined."""
    found: list[Instruction] = []
    pending = ""
    for line in dockerfile.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        keyword, _, arguments = (pending + stripped).partition(" ")
        found.append(Instruction(keyword.upper(), " ".join(arguments.split())))
        pending = ""
    return found


def stages(dockerfile: Path) -> list[list[Instruction]]:
    """The instructions of each build stage (each FROM starts one); global ARGs come first."""
    result: list[list[Instruction]] = [[]]
    for instruction in instructions(dockerfile):
        if instruction.keyword == "FROM":
            result.append([])
        result[-1].append(instruction)
    return result


def build_args(stage: list[Instruction]) -> dict[str, str]:
    """ARG name → default value ('' when it has none)."""
    args = {}
    for instruction in stage:
        if instruction.keyword == "ARG":
            name, _, default = instruction.arguments.partition("=")
            args[name] = shlex.split(default)[0] if default else ""
    return args
