"""The tables printed at start-up, as Triton prints them: the backends, the models with their
versions and states, and the server's options."""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterable, Sequence
from typing import Protocol

from coreserve.backend.api import Backend
from coreserve.repository import ControlMode, Model
from coreserve.repository.namespaces import qualified
from coreserve.version import __version__


class TabledOptions(Protocol):
    """What the tables say of the server's options (`ServerOptions` has it)."""

    server_id: str
    model_repositories: list[str]
    model_control_mode: ControlMode
    auto_complete_config: bool
    model_config_name: str
    rate_limit: str
    strict_readiness: bool
    exit_timeout_secs: float
    backend_config: dict[str, dict[str, str]]


def model_status_table(models: list[Model]) -> str:
    rows = [("Model", "Version", "Status")]
    for model in models:
        name = qualified(model.namespace, model.name)  # <repository>::<name> under namespacing, as Triton
        if not model.versions:
            rows.append((name, "-", f"UNAVAILABLE: {model.reason}"))
        for version in sorted(model.versions.values(), key=lambda v: v.version):
            status = version.state.value + (f": {version.reason}" if version.reason else "")
            rows.append((name, str(version.version), status))
    if len(rows) == 1:
        rows.append(("(no models)", "", ""))
    return text_table(rows)


def backends_table(backends: Iterable[Backend], options: TabledOptions) -> str:
    """Each backend: the file of its plugin, and the settings it was given (Triton's `cmdline`)."""
    rows: list[Sequence[str]] = [("Backend", "Path", "Config")]
    auto_complete = str(options.auto_complete_config).lower()
    for backend in sorted(backends, key=lambda b: b.name):
        settings = {"auto-complete-config": auto_complete, **options.backend_config.get(backend.name, {})}
        rows.append(
            (
                backend.name,
                inspect.getfile(type(backend)),
                json.dumps({"cmdline": settings}, separators=(",", ":")),
            )
        )
    return text_table(rows)


def options_table(options: TabledOptions, extensions: Sequence[str], cache_enabled: bool) -> str:
    """The server's options, in Triton's names and words (those of its GPU flags aside)."""
    rows: list[Sequence[str]] = [
        ("Option", "Value"),
        ("server_id", options.server_id),
        ("server_version", __version__),
        ("server_extensions", " ".join(extensions)),
    ]
    rows += [(f"model_repository_path[{i}]", path) for i, path in enumerate(options.model_repositories)]
    rows += [
        ("model_control_mode", f"MODE_{options.model_control_mode.name}"),
        ("strict_model_config", _flag(not options.auto_complete_config)),
        ("model_config_name", options.model_config_name),
        ("rate_limit", "EXEC_COUNT" if options.rate_limit == "execution_count" else "OFF"),
        ("strict_readiness", _flag(options.strict_readiness)),
        ("exit_timeout", f"{options.exit_timeout_secs:g}"),
        ("cache_enabled", _flag(cache_enabled)),
    ]
    return text_table(rows)


def _flag(value: bool) -> str:
    return "1" if value else "0"


def text_table(rows: Sequence[Sequence[str]]) -> str:
    """`rows` (the first the heading) as Triton's table printer draws them."""
    # A cell of several lines (a load error with its frames) takes as many lines of the table, in
    # its own column, as Triton's table printer does.
    cells = [[cell.splitlines() or [""] for cell in row] for row in rows]
    widths = [max(len(line) for row in cells for line in row[i]) for i in range(len(rows[0]))]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    lines = [rule]
    for index, row in enumerate(cells):
        for depth in range(max(len(cell) for cell in row)):
            parts = (cell[depth] if depth < len(cell) else "" for cell in row)
            padded = (part.ljust(width) for part, width in zip(parts, widths, strict=True))
            lines.append("| " + " | ".join(padded) + " |")
        if index == 0:
            lines.append(rule)
    lines.append(rule)
    return "\n".join(lines)
