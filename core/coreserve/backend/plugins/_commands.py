"""Subcommands of `coreserve` that plugins add: `coreserve NAME [ARG ...]`."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

logger = logging.getLogger(__name__)

_NAME = re.compile(r"[a-z][a-z0-9-]*")


@dataclass(frozen=True)
class PluginCommand:
    """One registered subcommand: its name, what runs it, one line of help."""

    name: str
    main: Callable[[Sequence[str]], int]
    help: str


class CommandRegistry:
    """Subcommands by name; `add` is what a plugin's `coreserve_register_commands` calls."""

    def __init__(self) -> None:
        self._by_name: dict[str, PluginCommand] = {}

    def add(self, name: str, main: Callable[[Sequence[str]], int], help: str) -> None:
        """Registers `coreserve NAME`: `main` gets the arguments after NAME and returns the exit code."""
        if not _NAME.fullmatch(name):
            raise ValueError(f"command name '{name}' must be lowercase letters, digits and '-'")
        if name in self._by_name:
            logger.warning("command '%s' is registered twice; keeping the first", name)
            return
        self._by_name[name] = PluginCommand(name, main, help)

    def get(self, name: str) -> PluginCommand | None:
        """The command of that name, or None."""
        return self._by_name.get(name)

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._by_name)
