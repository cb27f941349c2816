"""The folder of environments built from models' requirements.txt files, shared between servers.

    <cache>/<key>                 a symbolic link to the built environment: present only once
                                  the build is complete (it is created by an atomic rename)
    <cache>/.store/<key>.<nonce>/ the environment: a venv, its coreserve-env.json and .in-use
    <cache>/.locks/<key>.lock     held (fcntl.flock) while the environment is built or removed

An environment is built in its final folder and published by renaming a link onto it, not
moved there: a venv holds its own path (console scripts' shebangs, .pth files of editable
installs), so a moved one breaks. A build cut short leaves an unpublished folder, which the next
build of that key (or `coreserve python-envs prune`) removes. A server holds a shared lock on
an environment's .in-use file while it may start stubs from it, and touches the file at each
load (its time is "last used"); prune removes only environments whose .in-use it can lock alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import platform
import shutil
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger("coreserve.backend.python")

METADATA = "coreserve-env.json"
IN_USE = ".in-use"
STORE = ".store"
LOCKS = ".locks"
LOCK_POLL_S = 0.1


class LockTimeout(Exception):
    """Another process held an environment's lock for longer than we may wait (or the wait was
    given up)."""


def default_cache_dir() -> Path:
    """$XDG_CACHE_HOME/coreserve/python-envs, or ~/.cache/coreserve/python-envs."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "coreserve" / "python-envs"


def python_tag() -> str:
    """The running Python, as an environment built from it needs it: implementation and version."""
    return f"{sys.implementation.name}-{platform.python_version()}"


def environment_key(requirements: bytes, numpy_version: str) -> tuple[str, str]:
    """The cache key of an environment and the hash of its requirements.

    The key covers what the built environment depends on: the requirements' content, the
    Python that runs the stubs, the platform, and the numpy the stubs import (the server's,
    which the installer is held to).
    """
    requirements_hash = hashlib.sha256(requirements).hexdigest()
    described = f"{requirements_hash}\n{python_tag()}\n{sysconfig.get_platform()}\nnumpy=={numpy_version}"
    return hashlib.sha256(described.encode()).hexdigest()[:24], requirements_hash


@dataclass(frozen=True)
class CachedEnvironment:
    """One published environment of a cache folder, as `coreserve python-envs list` shows it."""

    key: str
    path: Path
    requirements_hash: str
    python: str
    installer: str
    last_used: float

    def size(self) -> int:
        """Bytes of its files (symbolic links not followed)."""
        total = 0
        for root, _dirs, files in os.walk(self.path):
            for name in files:
                with contextlib.suppress(OSError):
                    total += os.lstat(os.path.join(root, name)).st_size
        return total


class EnvironmentCache:
    """A cache folder of environments (see the module's docstring for its layout)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def lock_path(self, key: str) -> Path:
        return self.root / LOCKS / f"{key}.lock"

    @contextlib.contextmanager
    def locked(
        self, key: str, timeout: float, given_up: Callable[[], bool] = lambda: False
    ) -> Iterator[None]:
        """Holds the key's lock (across processes), waiting for it up to `timeout` s, or until
        `given_up()` says to stop waiting."""
        path = self.lock_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        waited = False
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if not waited:
                        logger.info("waiting for %s: another load builds or removes this environment", path)
                        waited = True
                    if time.monotonic() >= deadline:
                        raise LockTimeout(f"another process held {path} for {timeout:g} s") from None
                    if given_up():
                        raise LockTimeout(f"the wait for {path} was given up") from None
                    time.sleep(LOCK_POLL_S)
            yield
        finally:
            os.close(descriptor)  # releases the lock

    def published(self, key: str) -> Path | None:
        """The folder of the key's complete environment, or None."""
        link = self.root / key
        if not link.is_symlink():
            return None
        target = link.resolve()
        return target if (target / METADATA).is_file() else None

    def new_build_folder(self, key: str) -> Path:
        """A fresh folder to build the key's environment in (call it under the key's lock).

        Removes what earlier builds of the key that were cut short left.
        """
        store = self.root / STORE
        store.mkdir(parents=True, exist_ok=True)
        current = self.published(key)
        for leftover in store.glob(f"{key}.*"):
            if leftover != current:
                shutil.rmtree(leftover, ignore_errors=True)
        return Path(tempfile.mkdtemp(prefix=f"{key}.", dir=store))

    def publish(self, key: str, folder: Path, metadata: dict[str, str]) -> None:
        """Writes the environment's metadata, then links `<cache>/<key>` to it in one rename."""
        (folder / METADATA).write_text(json.dumps(metadata, indent=2) + "\n")
        (folder / IN_USE).touch()
        staged = self.root / f".{key}.link"
        staged.unlink(missing_ok=True)
        staged.symlink_to(folder.relative_to(self.root))
        staged.replace(self.root / key)

    def entries(self) -> list[CachedEnvironment]:
        """The published environments, most recently used first."""
        found = []
        for link in self.root.glob("*") if self.root.is_dir() else ():
            if link.name.startswith(".") or not link.is_symlink():
                continue
            folder = link.resolve()
            try:
                metadata = json.loads((folder / METADATA).read_text())
                last_used = (folder / IN_USE).stat().st_mtime
            except (OSError, ValueError):
                continue
            found.append(
                CachedEnvironment(
                    key=link.name,
                    path=folder,
                    requirements_hash=str(metadata.get("requirements_sha256", "")),
                    python=str(metadata.get("python", "")),
                    installer=str(metadata.get("installer", "")),
                    last_used=last_used,
                )
            )
        return sorted(found, key=lambda entry: entry.last_used, reverse=True)

    def remove_unused(self, entry: CachedEnvironment, timeout: float = 10.0) -> bool:
        """Removes an environment unless a server uses it; True if it was removed."""
        with self.locked(entry.key, timeout):
            in_use = os.open(entry.path / IN_USE, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                try:
                    fcntl.flock(in_use, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return False
                (self.root / entry.key).unlink(missing_ok=True)  # unpublished first: never half there
                shutil.rmtree(entry.path, ignore_errors=True)
            finally:
                os.close(in_use)
            return True

    def remove_leftovers(self, timeout: float = 10.0) -> list[Path]:
        """Removes the folders of builds cut short (none that a build in progress holds)."""
        removed = []
        store = self.root / STORE
        for folder in sorted(store.iterdir()) if store.is_dir() else ():
            key = folder.name.partition(".")[0]
            try:
                with self.locked(key, timeout):
                    if folder.is_dir() and folder != self.published(key):
                        shutil.rmtree(folder, ignore_errors=True)
                        removed.append(folder)
            except LockTimeout:
                continue
        return removed


class InUse:
    """The shared locks this process holds on the environments its stubs may start from."""

    def __init__(self) -> None:
        self._held: dict[Path, int] = {}

    def hold(self, folder: Path) -> None:
        """Marks `folder` used now and in use for as long as this process runs."""
        marker = folder / IN_USE
        if folder not in self._held:
            descriptor = os.open(marker, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(descriptor, fcntl.LOCK_SH)  # prune takes it alone, briefly, or not at all
            self._held[folder] = descriptor
        os.utime(marker)


IN_USE_HERE = InUse()
