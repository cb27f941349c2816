"""Model folders: names that stay inside the repository, and fingerprints of what they hold."""

from __future__ import annotations

import hashlib

from coreserve.errors import InvalidArgumentError

# POSIX's NAME_MAX on Linux, macOS and the BSDs, in bytes: no folder has a longer name.
MAX_NAME_BYTES = 255


def fingerprint(entries: list[tuple[str, int, object]]) -> str:
    """A digest of a model folder's entries (path, size, modification): changes when any file does."""
    digest = hashlib.sha256()
    for entry in sorted(entries, key=lambda item: item[0]):
        digest.update(repr(entry).encode())
    return digest.hexdigest()


def check_model_name(name: str) -> None:
    """Refuses names that are not a single, plain folder name (they could leave the repository)."""
    if (
        not name
        or "\x00" in name
        or "/" in name
        or "\\" in name
        or name in (".", "..")
        or name.startswith(".")
    ):
        raise InvalidArgumentError(f"'{name}' is not a valid model name: it must be a plain folder name")
