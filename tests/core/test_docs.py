"""Every hookspec is documented, with its signature, in the backend authors' guide."""

from __future__ import annotations

import dataclasses
import enum
import inspect
import re

from coreserve.backend.plugins import hookspecs
from support.paths import REPO


def test_every_hookspec_is_documented_with_its_signature() -> None:
    guide = (REPO / "docs" / "backends.md").read_text()
    specs = [
        (name, function)
        for name, function in vars(hookspecs).items()
        if name.startswith("coreserve_") and callable(function)
    ]
    assert specs, "no hookspecs found"
    for name, function in specs:
        signature = str(inspect.signature(function)).replace("'", "")
        assert f"### `{name}{signature}`" in guide, (
            f"docs/backends.md lacks the heading for {name}{signature}"
        )


def test_public_api_lists_are_sorted() -> None:
    import coreserve
    import coreserve.backend

    for module in (coreserve, coreserve.backend):
        assert module.__all__ == sorted(module.__all__)
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__} exports missing name {name}"


def test_documented_helpers_are_public() -> None:
    import coreserve.backend

    guide = (REPO / "docs" / "backends.md").read_text()
    helpers = guide.split("## 5. Helpers for framework backends", 1)[1].split("## 6.", 1)[0]
    first_cells = [line.split("|")[1] for line in helpers.splitlines() if line.startswith("| `")]
    names = {name for cell in first_cells for name in re.findall(r"`([A-Za-z_]+)", cell)}
    assert {"ModelTensor", "complete_config", "check_model_tensors", "choice_parameter"} <= names
    for name in names:
        assert name in coreserve.backend.__all__, (
            f"docs/backends.md names {name}, which coreserve.backend lacks"
        )


def test_request_cancellation_is_documented() -> None:
    import coreserve

    guide = (REPO / "docs" / "backends.md").read_text()
    for name in ("is_cancelled", "on_cancel", "wait_cancelled", "cancel"):
        assert callable(getattr(coreserve.InferenceRequest, name))
        assert f"`{name}(" in guide or f"`async {name}(" in guide, f"docs/backends.md lacks {name}"


def _reference_sections() -> dict[str, str]:
    """The guide's section 7, by the public name each `### `Name`` heading documents."""
    guide = (REPO / "docs" / "backends.md").read_text()
    reference = guide.split("## 7. Reference", 1)[1]
    sections = {}
    for block in reference.split("\n### `")[1:]:
        name, _, body = block.partition("`")
        sections[name] = body
    return sections


def _parameters(function: object) -> list[str]:
    signature = inspect.signature(function)  # type: ignore[arg-type]
    skipped = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [p.name for p in signature.parameters.values() if p.name != "self" and p.kind not in skipped]


def _mentions(section: str, owner: str, parameter: str) -> bool:
    """`parameter` quoted alone, or inside a quoted call of `owner`: `owner(a, parameter=…)`."""
    quoted_call = re.search(rf"`(async |await )?{re.escape(owner)}\([^`]*\b{re.escape(parameter)}\b", section)
    return f"`{parameter}`" in section or quoted_call is not None


def _undocumented(name: str, item: object, section: str) -> list[str]:
    """What of `item` (a public name of coreserve.backend) its section does not mention."""
    missing = []
    if not inspect.isclass(item):
        return [f"parameter '{p}'" for p in _parameters(item) if not _mentions(section, name, p)]
    if issubclass(item, enum.Enum):
        return [f"member '{member.name}'" for member in item if f"`{member.name}`" not in section]
    fields = [f.name for f in dataclasses.fields(item)] if dataclasses.is_dataclass(item) else []
    attributes = [a for a in vars(item).get("__annotations__", {}) if not a.startswith("_")]
    missing += [f"attribute '{a}'" for a in dict.fromkeys(fields + attributes) if f"`{a}`" not in section]
    if "__init__" in vars(item) and not dataclasses.is_dataclass(item):
        missing += [
            f"constructor parameter '{p}'" for p in _parameters(item) if not _mentions(section, name, p)
        ]
    for member, value in vars(item).items():
        if member.startswith("_") or not (callable(value) or isinstance(value, property | classmethod)):
            continue
        if not re.search(rf"`(async )?{member}[`(]", section):
            missing.append(f"member '{member}'")
            continue
        if callable(value):
            missing += [
                f"parameter '{p}' of {member}"
                for p in _parameters(value)
                if not _mentions(section, member, p)
            ]
    return missing


def test_every_public_name_of_the_backend_api_is_documented_with_its_parameters() -> None:
    import coreserve.backend

    sections = _reference_sections()
    problems = []
    for name in coreserve.backend.__all__:
        if name not in sections:
            problems.append(f"{name}: no '### `{name}`' heading in section 7")
            continue
        missing = _undocumented(name, getattr(coreserve.backend, name), sections[name])
        problems += [f"{name}: {what} is not mentioned" for what in missing]
    assert not problems, "docs/backends.md section 7 is incomplete:\n" + "\n".join(problems)
