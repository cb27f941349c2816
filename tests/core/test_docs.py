"""Every hookspec is documented, with its signature, in the backend authors' guide."""

from __future__ import annotations

import inspect
import re

from coreserve.backend import hookspecs
from paths import REPO


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
