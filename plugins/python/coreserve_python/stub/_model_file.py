"""The model's file as Triton's Python backend takes it: imported with its folder on sys.path,
and its errors in Triton's words."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import traceback
from pathlib import Path
from types import ModuleType


class ModelFileError(AttributeError):
    """A model file that holds no model: said in one line (a traceback would show the stub's code)."""


# The frames of this package (the stub, pb_utils) are left out of the frames an error lists.
OWN_FILES = str(Path(__file__).resolve().parents[1])


def describe(exc: BaseException) -> str:
    """The exception as Triton's Python backend words it: its type and text, then `At:` and the
    frames of the model's code, innermost first (the stub's own are left out)."""
    if isinstance(exc, ModelFileError):
        return f"AttributeError: {exc}"
    frames = [
        frame
        for frame in traceback.extract_tb(exc.__traceback__)
        if not frame.filename.startswith((OWN_FILES, "<"))
    ]
    at = "".join(f"  {frame.filename}({frame.lineno}): {frame.name}\n" for frame in reversed(frames))
    return f"{type(exc).__name__}: {exc}" + (f"\n\nAt:\n{at}" if at else "")


def load_model_module(model_file: Path, backend_based: bool = False) -> ModuleType:
    """Imports model.py as Triton's stub does: the version folder and the model's folder go at
    the end of sys.path (installed modules come first), and the file is module `<version>.model`
    of the version folder taken as a package, so `from . import helper` works beside `import
    helper` and `import beside_config`. A Python-based backend's file (`backend_based`) is module
    `model`, with its own folder at the end of sys.path."""
    if backend_based:
        folders = [str(model_file.parent)]
        name = model_file.stem
    else:
        version_folder = model_file.parent
        folders = [str(version_folder), str(version_folder.parent)]
        package = version_folder.name
        sys.modules[package] = _package(package, version_folder)
        name = f"{package}.{model_file.stem}"
    for folder in folders:
        if folder not in sys.path:
            sys.path.append(folder)
    spec = importlib.util.spec_from_file_location(name, model_file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {model_file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    if not hasattr(module, "TritonPythonModel"):
        raise ModelFileError(f"module '{name}' has no attribute 'TritonPythonModel' ({model_file})")
    return module


def _package(name: str, folder: Path) -> ModuleType:
    """The version folder as a package (a namespace one, or the one its __init__.py makes)."""
    init = folder / "__init__.py"
    if not init.exists():
        spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
        spec.submodule_search_locations = [str(folder)]
        return importlib.util.module_from_spec(spec)
    found = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(folder)])
    if found is None or found.loader is None:
        raise ImportError(f"cannot import {init}")
    package = importlib.util.module_from_spec(found)
    sys.modules[name] = package  # (its own relative imports find it)
    found.loader.exec_module(package)
    return package


def failed_execution(instance_name: str, reason: str) -> str:
    """An execution's error, as Triton words it."""
    return f"Failed to process the request(s) for model '{instance_name}', message: {reason}"
