"""Which Python runs a model's stubs: this one, or the one `EXECUTION_ENV_PATH` names."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

from coreserve import ModelConfig, ModelConfigError
from coreserve_python.server._process import StubLaunch, stub_environment

PACKAGE = Path(__file__).resolve().parents[1]
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
    "pb_utils/_runtime.py",
    "pb_utils/_metrics.py",
    "pb_utils/_management.py",
    "pb_utils/_inference.py",
    "stub/__init__.py",
    "stub/__main__.py",
    "stub/_inbox.py",
    "stub/_requests.py",
    "stub/_stub.py",
    "shim/triton_python_backend_utils.py",
)
CACHE = Path(os.environ.get("CORESERVE_CACHE", Path(tempfile.gettempdir()) / "coreserve-cache"))


def stub_launch(config: ModelConfig, model_name: str, model_path: Path) -> StubLaunch:
    """The interpreter and environment for the stubs of a model.

    `EXECUTION_ENV_PATH` may name an environment folder (its bin/python is used), a Python
    executable, or a packed environment (.tar.gz, unpacked once into a cache folder);
    `$$TRITON_MODEL_DIRECTORY` in it stands for the model's folder. Another Python gets a
    copy of the stub's modules on its PYTHONPATH, and nothing else of this environment.
    """
    entry = config.parameters.get("EXECUTION_ENV_PATH")
    if entry is None or not entry.string_value.strip():
        return StubLaunch(sys.executable)
    where = f"model '{model_name}': parameter EXECUTION_ENV_PATH"
    path = Path(entry.string_value.strip().replace("$$TRITON_MODEL_DIRECTORY", str(model_path)))
    if not path.exists():
        raise ModelConfigError(f"{where}: {path} does not exist")
    if path.is_file() and path.name.endswith((".tar.gz", ".tgz")):
        path = _unpacked(path, where)
    python = _interpreter(path, where)
    return StubLaunch(str(python), stub_environment(_stub_modules()))


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
