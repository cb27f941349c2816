"""Which Python runs a model's stubs: this one, the one `EXECUTION_ENV_PATH` names, or one built
from the model's requirements.txt."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from coreserve import ModelConfig, ModelConfigError, UnavailableError
from coreserve.backend import ModelFiles
from coreserve_python.server._process import StubLaunch, stub_environment
from coreserve_python.server.env._build import Builds, EnvironmentBuildError, build_environment
from coreserve_python.server.env.cache import (
    IN_USE_HERE,
    EnvironmentCache,
    LockTimeout,
    default_cache_dir,
    environment_key,
    python_tag,
)

logger = logging.getLogger("coreserve.backend.python")

PACKAGE = Path(__file__).resolve().parents[2]
# What a stub imports, relative to PACKAGE: the stub, the pb_utils API, the IPC and the shim.
STUB_MODULES = (
    "__init__.py",
    "ipc/__init__.py",
    "ipc/_messages.py",
    "ipc/_channel.py",
    "ipc/_segments.py",
    "ipc/_start_mark.py",
    "pb_utils/__init__.py",
    "pb_utils/_errors.py",
    "pb_utils/_types.py",
    "pb_utils/_dlpack.py",
    "pb_utils/_tensor.py",
    "pb_utils/_model_config.py",
    "pb_utils/runtime.py",
    "pb_utils/_metrics.py",
    "pb_utils/_management.py",
    "pb_utils/_logger.py",
    "pb_utils/_response_iterator.py",
    "pb_utils/inference.py",
    "stub/__init__.py",
    "stub/__main__.py",
    "stub/_forked.py",
    "stub/_inbox.py",
    "stub/_model_file.py",
    "stub/_requests.py",
    "stub/_responses.py",
    "stub/_stub.py",
    "shim/c_python_backend_utils.py",
    "shim/triton_python_backend_utils.py",
)
CACHE = Path(os.environ.get("CORESERVE_CACHE", Path(tempfile.gettempdir()) / "coreserve-cache"))
REQUIREMENTS = "requirements.txt"
# --backend-config python,<key>=<value> (--python-env-cache-dir sets the first).
ENV_CACHE_DIR = "env-cache-dir"
ENV_BUILD_TIMEOUT = "env-build-timeout-secs"
DEFAULT_ENV_BUILD_TIMEOUT_S = 600.0


def stub_launch(
    config: ModelConfig, model: ModelFiles, settings: Mapping[str, str], builds: Builds
) -> StubLaunch:
    """The interpreter and environment for the stubs of a model.

    `EXECUTION_ENV_PATH` may name an environment folder (its bin/python is used), a Python
    executable, or a packed environment (.tar.gz, unpacked once into a cache folder);
    `$$TRITON_MODEL_DIRECTORY` in it stands for the model's folder. Another Python gets a
    copy of the stub's modules on its PYTHONPATH, and nothing else of this environment.
    Without it, a requirements.txt in the version's folder, else in the model's, has an
    environment built (once, cached; see `_requirements_launch`), one of `builds`. `settings`
    are the backend's --backend-config values.
    """
    entry = config.parameters.get("EXECUTION_ENV_PATH")
    if entry is None or not entry.string_value.strip():
        requirements = requirements_file(model)
        if requirements is None:
            return StubLaunch(sys.executable)
        return _requirements_launch(requirements, model.name, settings, builds)
    where = f"model '{model.name}': parameter EXECUTION_ENV_PATH"
    path = Path(entry.string_value.strip().replace("$$TRITON_MODEL_DIRECTORY", str(model.path)))
    if not path.exists():
        raise ModelConfigError(f"{where}: {path} does not exist")
    if path.is_file() and path.name.endswith((".tar.gz", ".tgz")):
        path = _unpacked(path, where)
    python = _interpreter(path, where)
    return StubLaunch(str(python), stub_environment(_stub_modules()))


def requirements_file(model: ModelFiles) -> Path | None:
    """The model's requirements.txt: its version folder's, else its own folder's, else None."""
    for folder in (model.version_path, model.path):
        if (folder / REQUIREMENTS).is_file():
            return folder / REQUIREMENTS
    return None


def env_cache_dir(settings: Mapping[str, str]) -> Path:
    """The folder of built environments: --python-env-cache-dir, else the user's cache folder."""
    given = settings.get(ENV_CACHE_DIR, "").strip()
    return Path(given).expanduser() if given else default_cache_dir()


def env_build_timeout(settings: Mapping[str, str], model_name: str) -> float:
    text = settings.get(ENV_BUILD_TIMEOUT, "").strip()
    if not text:
        return DEFAULT_ENV_BUILD_TIMEOUT_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise ModelConfigError(
            f"model '{model_name}': --backend-config python,{ENV_BUILD_TIMEOUT} must be a number of "
            f"seconds above 0, got '{text}'"
        )
    return seconds


def _requirements_launch(
    requirements: Path, model_name: str, settings: Mapping[str, str], builds: Builds
) -> StubLaunch:
    """Stubs in the venv built from `requirements` (built now unless the cache holds it).

    The venv has no site-packages of this Python: the stub gets a copy of its own modules and
    this Python's numpy on PYTHONPATH (the venv's Python is this Python, so numpy's compiled
    parts fit it; the installer was held to the same numpy version), and the model sees what
    its requirements install and nothing else of the server's environment.
    """
    cache = EnvironmentCache(env_cache_dir(settings))
    timeout = env_build_timeout(settings, model_name)
    key, requirements_hash = environment_key(requirements.read_bytes(), np.__version__)
    label = f"model '{model_name}': {requirements}"
    try:
        # Waits for a build of the same requirements elsewhere, then finds it published; a stop
        # of the server gives the wait up.
        with builds.build() as build, cache.locked(key, timeout, given_up=lambda: build.stopped):
            folder = cache.published(key)
            if folder is None:
                folder = cache.new_build_folder(key)
                logger.info("%s: building a Python environment in %s", label, folder)
                try:
                    installer = build_environment(requirements, folder, np.__version__, timeout, label, build)
                except BaseException:
                    shutil.rmtree(folder, ignore_errors=True)
                    raise
                metadata = {
                    "requirements_sha256": requirements_hash,
                    "python": python_tag(),
                    "numpy": np.__version__,
                    "installer": installer,
                }  # not the requirements' text: an index URL in it may carry a token
                cache.publish(key, folder, metadata)
                logger.info("%s: built the Python environment %s with %s", label, folder, installer)
            else:
                logger.info("%s: using the cached Python environment %s", label, folder)
            IN_USE_HERE.hold(folder)
    except EnvironmentBuildError as exc:
        raise UnavailableError(f"model '{model_name}': installing {requirements} failed:\n{exc}") from None
    except (LockTimeout, OSError) as exc:
        raise UnavailableError(
            f"model '{model_name}': cannot build the environment of {requirements}: {exc}"
        ) from None
    return StubLaunch(str(folder / "bin" / "python"), stub_environment(_stub_modules(), _server_numpy()))


def _interpreter(path: Path, where: str) -> Path:
    if path.is_dir():
        for candidate in (path / "bin" / "python3", path / "bin" / "python", path / "python.exe"):
            if candidate.exists():
                return candidate
        raise ModelConfigError(f"{where}: {path} holds no bin/python")
    if not os.access(path, os.X_OK):
        raise ModelConfigError(f"{where}: {path} is not an executable Python")
    return path


def _unpacked(archive: Path, where: str) -> Path:
    """The folder `archive` is unpacked in, unpacking it first if no one has yet.

    Unpacks into a folder of its own and renames it into place, so that two loads unpacking
    the same archive at once (two versions of a model, say) never see a half-written folder.
    """
    digest = hashlib.sha256(f"{archive.resolve()}:{archive.stat().st_mtime_ns}".encode()).hexdigest()[:16]
    target = CACHE / "envs" / digest
    if (target / ".complete").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{digest}-", dir=target.parent))
    try:
        with tarfile.open(archive) as packed:
            # "tar", not "data": environments hold symlinks to their base interpreter.
            packed.extractall(scratch, filter="tar")
        (scratch / ".complete").touch()
        if target.exists() and not (target / ".complete").exists():
            shutil.rmtree(target, ignore_errors=True)  # left by an unpacking cut short
        scratch.rename(target)
    except (tarfile.TarError, OSError) as exc:
        shutil.rmtree(scratch, ignore_errors=True)
        if (target / ".complete").exists():
            return target  # another load finished the same unpacking first
        raise ModelConfigError(f"{where}: cannot unpack {archive}: {exc}") from None
    return target


def _server_numpy() -> Path:
    """A folder holding only this Python's numpy (links to its package and bundled libraries)."""
    package = Path(np.__file__).resolve().parent
    digest = hashlib.sha256(f"{package}:{np.__version__}".encode()).hexdigest()[:16]
    root = CACHE / f"numpy-{digest}"
    if not (root / "numpy").exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".numpy-{digest}-", dir=CACHE))
        for name in ("numpy", "numpy.libs"):  # numpy.libs: the libraries a manylinux wheel bundles
            if (package.parent / name).exists():
                (scratch / name).symlink_to(package.parent / name)
        try:
            scratch.rename(root)
        except OSError:  # another load made it first
            shutil.rmtree(scratch, ignore_errors=True)
    return root


def _stub_modules() -> Path:
    """A folder holding a copy of the stub's modules (standard library and numpy only)."""
    digest = hashlib.sha256(b"".join((PACKAGE / name).read_bytes() for name in STUB_MODULES)).hexdigest()[:16]
    root = CACHE / f"stub-{digest}"
    package = root / "coreserve_python"
    if not (package / STUB_MODULES[-1]).exists():
        for name in STUB_MODULES:
            (package / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(PACKAGE / name, package / name)
    return root
