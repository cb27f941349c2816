"""Model management from a model: `load_model`, `unload_model`, `is_model_ready`.

They go through the server's repository API, so they follow its rules: loading and unloading
need `--model-control-mode=explicit`, as on Triton. Names may be str or bytes.
"""

from __future__ import annotations

import coreserve_python.pb_utils.runtime as _runtime


def _text(value: str | bytes) -> str:
    return value.decode("utf-8") if isinstance(value, bytes | bytearray) else str(value)


def load_model(model_name: str | bytes, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Loads (or reloads) a model of the repository.

    :param model_name: the model to load.
    :param config: its configuration as a JSON string, in place of its config.pbtxt.
    :param files: `{"file:<path>": bytes}`: the model's files, in place of its folder (needs
        `config`).
    """
    parameters: dict[str, object] = {}
    if config:
        parameters["config"] = config
    for key, content in (files or {}).items():
        parameters[key] = bytes(content)
    _runtime.require("load_model").ask(
        "load_model", {"name": _text(model_name), "parameters": parameters}, "Failed to load model"
    )


def unload_model(model_name: str | bytes, unload_dependents: bool = False) -> None:
    """Unloads a model (and, with `unload_dependents`, the ensembles that use it)."""
    _runtime.require("unload_model").ask(
        "unload_model",
        {"name": _text(model_name), "dependents": bool(unload_dependents)},
        "Failed to unload model",
    )


def is_model_ready(model_name: str | bytes, model_version: str = "") -> bool:
    """Whether the model (the version, if given) is ready to serve."""
    ready: bool = _runtime.require("is_model_ready").ask(
        "model_ready",
        {"name": _text(model_name), "version": _text(model_version)},
        "Failed to check model readiness",
    )
    return ready
