"""Every hookspec is documented, with its signature, in the backend authors' guide."""

from __future__ import annotations

import inspect

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
