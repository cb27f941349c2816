"""Where model folders come from: local folders, or object storage through fsspec.

A source lists its models with a fingerprint of each (file names, sizes and modification
times), which poll mode compares to notice changes, and gives a local folder for a model
(remote models are copied into a cache folder first).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Protocol

from coreserve.errors import InvalidArgumentError, NotFoundError
from coreserve.repository.storage._folders import check_model_name, fingerprint
from coreserve.repository.storage._remote import RemoteSource

logger = logging.getLogger(__name__)


class RepositorySource(Protocol):
    """One `--model-repository`: local or remote."""

    label: str
    # Whether `local_path` is a copy of this server's own (its files' times say when it copied them).
    copies_files: bool

    def scan(self) -> dict[str, str]:
        """Every model folder of the repository with its fingerprint (blocking I/O)."""
        ...

    def local_path(self, name: str) -> Path:
        """A local folder holding the model, fetched first if the repository is remote (blocking)."""
        ...


class LocalSource:
    """A model repository in a local folder."""

    copies_files = False

    def __init__(self, path: Path) -> None:
        self.path = path
        self.label = str(path)

    def scan(self) -> dict[str, str]:
        models = {}
        for entry in sorted(self.path.iterdir()):
            if entry.is_dir() and not entry.name.startswith("."):
                models[entry.name] = fingerprint(list(_local_entries(entry)))
        return models

    def local_path(self, name: str) -> Path:
        check_model_name(name)
        path = self.path / name
        if not path.is_dir():
            raise NotFoundError(f"model '{name}' is not in the repository {self.label}")
        root = self.path.resolve()
        if root != path.resolve().parent:
            raise InvalidArgumentError(f"model '{name}' is a link that leaves the repository {self.label}")
        return path


def _local_entries(folder: Path) -> list[tuple[str, int, object]]:
    """Each file of a model folder with its size and time, through links to folders too (a
    version folder that links to a build: pointing it elsewhere changes the model)."""
    entries: list[tuple[str, int, object]] = []
    walked: set[str] = set()
    for root, folders, files in os.walk(folder, followlinks=True):
        real = os.path.realpath(root)
        if real in walked:  # (a link back up the tree: walked once)
            folders.clear()
            continue
        walked.add(real)
        for name in files:
            path = Path(root, name)
            try:
                stat = path.stat()
            except OSError:  # (a link to nothing)
                continue
            entries.append((str(path.relative_to(folder)), stat.st_size, stat.st_mtime_ns))
    return entries


def source_for(location: str, cache_dir: Path) -> RepositorySource:
    """The source for a `--model-repository` value: a folder, or an fsspec URL (s3://, gs://…)."""
    if "://" in location:
        return RemoteSource(location, cache_dir)
    return LocalSource(Path(location))
