"""The public API is what the public modules list in `__all__`: sorted, complete, and all that
plugins and examples use (httpx's habit: a name defined or re-exported but not listed is a bug)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from support.paths import REPO

PUBLIC_MODULES = ("coreserve", "coreserve.backend", "coreserve.testing", "coreserve.ray")


def _source(module: str) -> Path:
    return REPO / "core" / module.replace(".", "/") / "__init__.py"


def _bound_names(module: str) -> set[str]:
    """Public names a public module binds at its top level: its own definitions and what it
    imports from coreserve (names taken from typing or `__future__` are not its API)."""
    tree = ast.parse(_source(module).read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("coreserve"):
            names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(target.id for target in node.targets if isinstance(target, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {name for name in names if not name.startswith("_")}


def _exported(module: str) -> list[str]:
    """The module's `__all__`, read from its source (coreserve.ray imports Ray, an extra)."""
    for node in ast.parse(_source(module).read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
        ):
            return [ast.literal_eval(element) for element in node.value.elts]  # type: ignore[attr-defined]
    raise AssertionError(f"{module} has no __all__")


def _isort_order(name: str) -> tuple[int, str]:
    """ruff's order for `__all__` (RUF022): CONSTANTS, then Classes, then the rest."""
    kind = 0 if name.isupper() and len(name) > 1 else 1 if name[:1].isupper() else 2
    return kind, name


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_all_is_sorted(module: str) -> None:
    exported = _exported(module)
    assert exported == sorted(exported, key=_isort_order)


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_all_is_complete(module: str) -> None:
    """Every public name the module binds is listed, and every listed name resolves (some
    are resolved lazily, by the module's `__getattr__`)."""
    exported = _exported(module)
    assert _bound_names(module) - set(exported) == set()
    imported = importlib.import_module(module)
    assert [name for name in exported if not hasattr(imported, name)] == []


def _python_files() -> list[Path]:
    files = [path for path in (REPO / "plugins").rglob("*.py")]
    files += [path for path in (REPO / "examples").rglob("*.py")]
    return [path for path in files if ".venv" not in path.parts]


def test_plugins_and_examples_import_only_listed_names() -> None:
    exported = {module: set(_exported(module)) for module in PUBLIC_MODULES if module != "coreserve.ray"}
    violations = []
    for path in _python_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.level == 0):
                continue
            if node.module.startswith("coreserve_") or not node.module.startswith("coreserve"):
                continue
            if node.module not in exported:
                violations.append(f"{path.relative_to(REPO)} imports the module {node.module}")
                continue
            for alias in node.names:
                if alias.name not in exported[node.module]:
                    violations.append(f"{path.relative_to(REPO)} imports {node.module}.{alias.name}")
    assert violations == []
