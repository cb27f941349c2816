"""The model's file as Triton's Python backend takes it: imported with its folder on sys.path,
and its errors and refused return values in Triton's words."""

from __future__ import annotations

import importlib.util
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any


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


def load_model_module(model_file: Path) -> ModuleType:
    """Imports model.py as Triton does: its folder is on sys.path for sibling imports."""
    folder = str(model_file.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(model_file.stem, model_file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {model_file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[model_file.stem] = module
    spec.loader.exec_module(module)
    if not hasattr(module, "TritonPythonModel"):
        name = model_file.stem
        raise ModelFileError(f"module '{name}' has no attribute 'TritonPythonModel' ({model_file})")
    return module


def failed_execution(instance_name: str, reason: str) -> str:
    """An execution's error, as Triton words it."""
    return f"Failed to process the request(s) for model '{instance_name}', message: {reason}"


def refused_return(result: Any, requests: int) -> str | None:
    """Why Triton refuses what an ordinary model's execute returned for `requests` requests
    (None: a list of as many)."""
    if not isinstance(result, list):
        return f"Expected a list in the execute return, found type '{type(result)}'."
    if len(result) != requests:
        return (
            "Number of InferenceResponse objects do not match the number of InferenceRequest "
            f"objects. InferenceRequest(s) size is:{requests}, and InferenceResponse(s) size "
            f"is:{len(result)}\n"
        )
    return None
