"""Imports flow down the layers, and plugins use only the public API."""

from __future__ import annotations

import ast
from pathlib import Path

from paths import REPO

CORE = REPO / "core" / "coreserve"
# A module may import from its own layer and the layers below it (lower number).
LAYERS = {
    "coreserve.errors": 0,
    "coreserve.types": 0,
    "coreserve.protos": 0,
    # A request carries its trace (types names it), so tracing sits beside types and errors.
    "coreserve.tracing": 0,
    "coreserve.responses": 1,
    "coreserve.config": 1,
    "coreserve.protocol": 1,
    "coreserve.json_worker": 2,  # the server's process that parses large JSON bodies: protocol only
    "coreserve.backend": 2,
    "coreserve.scheduling": 3,
    "coreserve.ensemble": 3,
    "coreserve.repository": 4,
    "coreserve.server": 5,
    "coreserve.server.openai": 5,  # a frontend, beside the server's own
    "coreserve.inprocess": 6,  # the in-process API runs a server
    "coreserve.ray": 6,  # Ray Serve replicas run the in-process API; `coreserve ray` reads the CLI's flags
    "coreserve.cli": 6,
    "coreserve.testing": 6,
    "coreserve.__main__": 6,
}
PUBLIC = {"coreserve", "coreserve.backend"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(CORE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> int | None:
    for prefix, layer in sorted(LAYERS.items(), key=lambda item: -len(item[0])):
        if module == prefix or module.startswith(prefix + "."):
            return layer
    return None


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return [name for name in found if name.startswith("coreserve")]


def test_core_imports_flow_down_the_layers() -> None:
    violations = []
    for path in CORE.rglob("*.py"):
        if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue
        module = _module_name(path)
        own = _layer(module)
        if own is None:  # the package root re-exports the public API
            continue
        for imported in _imports(path):
            layer = _layer(imported)
            if layer is not None and layer > own:
                violations.append(f"{module} (layer {own}) imports {imported} (layer {layer})")
    assert not violations, "\n".join(violations)


def test_plugins_import_only_the_public_api() -> None:
    violations = []
    for path in (REPO / "plugins").rglob("*.py"):
        for imported in _imports(path):
            if imported.startswith("coreserve_"):
                continue
            if imported not in PUBLIC:
                violations.append(f"{path.relative_to(REPO)} imports {imported}")
    assert not violations, "\n".join(violations)
