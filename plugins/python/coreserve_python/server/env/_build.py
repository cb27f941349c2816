"""Building a venv from a requirements.txt: with uv where it is installed, else venv and pip.

The venv is made from the server's own Python, and sees the server's site-packages below its
own: what the server has already (the requirements of a Triton repository, often) is not
installed again, and what the requirements install comes first. The installer is held to the
server's numpy (a constraint), the numpy the stubs import. Every line the installer prints
goes to the log at INFO; a build that fails raises EnvironmentBuildError carrying the last
lines of its error output. A server's builds (`Builds`: those under way, and the loads waiting
for another's lock to build) are stopped when it stops: the installer running then is killed
with its whole process group, and a build that comes later is refused.
"""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import logging
import os
import shutil
import signal
import site
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

logger = logging.getLogger("coreserve.backend.python")

ERROR_LINES = 20
TRUE = ("1", "true", "yes", "on")


class EnvironmentBuildError(Exception):
    """The installer failed, ran out of time or was stopped; the message holds its last error lines."""


class _Build:
    """Stops a build that runs in another thread: the installer running then is killed with its
    whole process group, and the build raises EnvironmentBuildError instead of going on."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[str] | None = None
        self.stopped = False

    def stop(self) -> None:
        with self._lock:
            self.stopped = True
            if self._process is not None:
                _kill_group(self._process)

    def running(self, process: subprocess.Popen[str] | None) -> None:
        """The installer now running (None: none); one that starts after a stop is killed."""
        with self._lock:
            self._process = process
            if process is not None and self.stopped:
                _kill_group(process)


def _kill_group(process: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # the installer leads its own group


class Builds:
    """The environment builds of one server's loads (its Python backend's): `stop` stops those
    under way, from the wait for their lock on, and every one that begins after it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._under_way: set[_Build] = set()
        self._stopped = False

    @contextlib.contextmanager
    def build(self) -> Iterator[_Build]:
        """A build, stopped by `stop` while this holds (a load that waits for another's build
        is given up at a stop, not built after it)."""
        build = _Build()
        with self._lock:
            build.stopped = self._stopped
            self._under_way.add(build)
        try:
            yield build
        finally:
            with self._lock:
                self._under_way.discard(build)

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            under_way = list(self._under_way)
        for build in under_way:
            build.stop()


def uv_binary() -> str | None:
    """uv's executable: the `uv` package's, where it is importable, else `uv` on PATH."""
    with contextlib.suppress(ImportError, FileNotFoundError):
        import uv  # type: ignore[import-not-found,unused-ignore]

        return str(uv.find_uv_bin())
    return shutil.which("uv")


def build_environment(
    requirements: Path,
    folder: Path,
    numpy_version: str,
    timeout: float,
    label: str,
    build: _Build | None = None,
) -> str:
    """Builds a venv in `folder` with what `requirements` names; returns the installer's name.

    The installer runs in the requirements' folder (relative paths in the file resolve there)
    with this process's environment, so pip's configuration (PIP_* variables, pip.conf) holds.
    `build`: the `Builds.build` this is part of (one that nothing stops otherwise).
    """
    build = build or _Build()
    if build.stopped:
        raise EnvironmentBuildError("the server stopped before the build began")
    return _build(requirements.resolve(), folder, numpy_version, time.monotonic() + timeout, label, build)


def _build(
    requirements: Path, folder: Path, numpy_version: str, deadline: float, label: str, build: _Build
) -> str:
    constraints = folder / "coreserve-constraints.txt"
    python = folder / "bin" / "python"
    uv = uv_binary()
    install: list[str]
    if uv is not None:
        venv = [uv, "venv", "--quiet", "--python", sys.executable, str(folder)]
        _run(venv, requirements, deadline, label, build)
        install = [uv, "pip", "install", "--python", str(python)]
        installer = "uv"
    else:
        venv = [sys.executable, "-m", "venv", "--without-pip", str(folder)]
        _run(venv, requirements, deadline, label, build)
        if importlib.util.find_spec("pip") is not None:
            # This Python's pip installs into the venv: no copy of pip in each environment.
            install = [sys.executable, "-m", "pip", "--python", str(python), "install"]
        else:
            _run([str(python), "-m", "ensurepip", "--default-pip"], requirements, deadline, label, build)
            install = [str(python), "-m", "pip", "install"]
        install += ["--progress-bar", "off"]
        installer = "pip"
    _see_the_servers_packages(folder)
    constraints.write_text(f"numpy=={numpy_version}\n")
    _run([*install, "-r", str(requirements), "-c", str(constraints)], requirements, deadline, label, build)
    return installer


def _see_the_servers_packages(folder: Path) -> None:
    """A .pth file in the venv's site-packages naming the server's: read after the venv's own,
    they come after them on the path (a venv made with --system-site-packages from the server's
    Python would see the Python's, not those of the venv the server runs in)."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    own = folder / "lib" / version / "site-packages"
    own.mkdir(parents=True, exist_ok=True)
    (own / "coreserve-server-packages.pth").write_text("\n".join(site.getsitepackages()) + "\n")


def uv_settings(environ: os._Environ[str] | dict[str, str]) -> dict[str, str]:
    """pip's variables as uv's (uv reads UV_* variables and uv.toml, not pip's), in the
    environment rather than on the command line, where an index URL's token would be visible
    to every user of the machine; uv's own variables, where set, stay."""
    pairs = {
        "PIP_INDEX_URL": "UV_INDEX_URL",
        "PIP_EXTRA_INDEX_URL": "UV_EXTRA_INDEX_URL",
        "PIP_FIND_LINKS": "UV_FIND_LINKS",
    }
    settings = {uv: environ[pip] for pip, uv in pairs.items() if environ.get(pip) and uv not in environ}
    if environ.get("PIP_NO_INDEX", "").lower() in TRUE and "UV_NO_INDEX" not in environ:
        settings["UV_NO_INDEX"] = "1"
    return settings


def _run(command: Sequence[str], requirements: Path, deadline: float, label: str, build: _Build) -> None:
    if build.stopped:
        raise EnvironmentBuildError("the build was stopped: the server stops")
    env = {**os.environ, **uv_settings(os.environ)}
    env.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    env.setdefault("PIP_NO_INPUT", "1")
    process = subprocess.Popen(
        list(command),
        cwd=requirements.parent,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        # A process group of its own, stopped whole at the deadline or when the server stops; in
        # the server's session, as which a server of several workers ends it if the server dies.
        process_group=0,
    )
    build.running(process)
    errors: collections.deque[str] = collections.deque(maxlen=ERROR_LINES)
    assert process.stdout is not None and process.stderr is not None
    readers = [
        threading.Thread(target=_relay, args=(process.stdout, None, label), daemon=True),
        threading.Thread(target=_relay, args=(process.stderr, errors, label), daemon=True),
    ]
    for reader in readers:
        reader.start()
    try:
        code = process.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        _kill_group(process)
        process.wait()
        code = None
    finally:
        build.running(None)
    for reader, stream in zip(readers, (process.stdout, process.stderr), strict=True):
        reader.join(timeout=5)
        if not reader.is_alive():  # else a process the installer left holds the pipe open
            stream.close()
    if build.stopped:
        raise EnvironmentBuildError(f"{command[0]} was stopped: the server stops")
    if code is None:
        raise EnvironmentBuildError(f"{command[0]} ran out of time and was stopped:\n" + "\n".join(errors))
    if code != 0:
        tail = "\n".join(errors) or f"{Path(command[0]).name} exited with code {code}"
        raise EnvironmentBuildError(tail)


def _relay(stream: IO[str], kept: collections.deque[str] | None, label: str) -> None:
    for line in stream:
        line = line.rstrip()
        if not line:
            continue
        logger.info("%s: %s", label, line)
        if kept is not None:
            kept.append(line)
