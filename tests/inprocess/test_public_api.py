"""The in-process API stays what other code builds on: exported, documented, typed."""

from __future__ import annotations

import inspect

import coreserve


def test_the_in_process_names_are_exported_from_coreserve() -> None:
    for name in ("Model", "Server", "ServerOptions", "StartupError"):
        assert name in coreserve.__all__
        assert getattr(coreserve, name).__name__ == name
    assert issubclass(coreserve.StartupError, coreserve.CoreserveError)


def test_every_public_method_says_what_it_is_for() -> None:
    undocumented = [
        f"{cls.__name__}.{name}"
        for cls in (coreserve.Server, coreserve.Model)
        for name, member in vars(cls).items()
        if not name.startswith("_") and callable(member) and not inspect.getdoc(member)
    ]
    assert not undocumented
    for cls in (coreserve.Server, coreserve.Model):
        assert inspect.getdoc(cls)
