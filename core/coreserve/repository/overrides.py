"""Loading a model with parameters, as Triton's repository API accepts them.

`config` is a JSON model configuration that replaces config.pbtxt for this load;
`file:<path>` entries carry the model's files (`file:1/model.onnx`), which are written into a
fresh folder of the server's cache, never into the repository. Paths that could leave that
folder are refused before anything is written.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from coreserve.config import ModelConfig, config_from_dict
from coreserve.errors import InvalidArgumentError


@dataclass
class LoadOverrides:
    """What a load request replaces: the configuration, the files, or both."""

    config: ModelConfig | None = None
    files: dict[str, bytes] = field(default_factory=dict)


def parse_load_parameters(model_name: str, parameters: Mapping[str, object]) -> LoadOverrides:
    overrides = LoadOverrides()
    for key, value in parameters.items():
        if key == "config":
            if not isinstance(value, str):
                raise InvalidArgumentError("load parameter 'config' must be a JSON string")
            try:
                document = json.loads(value)
            except json.JSONDecodeError as exc:
                raise InvalidArgumentError(f"load parameter 'config' is not valid JSON: {exc}") from None
            if not isinstance(document, dict):
                raise InvalidArgumentError("load parameter 'config' must be a JSON object")
            overrides.config = config_from_dict(
                document, source=f"load parameter 'config' of model '{model_name}'"
            )
        elif key.startswith("file:"):
            relative = key[len("file:") :]
            check_relative_path(relative)
            if not isinstance(value, bytes):
                raise InvalidArgumentError(f"load parameter '{key}' must carry the file's bytes")
            overrides.files[relative] = value
        else:
            raise InvalidArgumentError(f"unknown load parameter '{key}' (known: config, file:<path>)")
    if overrides.files and overrides.config is None:
        raise InvalidArgumentError("load parameters 'file:…' need a 'config' parameter too")
    return overrides


def check_relative_path(relative: str) -> None:
    """Refuses paths that are absolute, climb out, or hide a NUL byte."""
    parts = PurePosixPath(relative).parts
    if (
        not relative
        or "\x00" in relative
        or "\\" in relative
        or relative.startswith("/")
        or any(part in ("..", ".", "") for part in relative.split("/"))
        or not parts
    ):
        raise InvalidArgumentError(f"file path '{relative}' is not a relative path inside the model's folder")


def write_override_files(cache_dir: Path, model_name: str, files: Mapping[str, bytes]) -> Path:
    """Writes the files into a new folder `<cache>/overrides/<unique>/<model>` and returns it."""
    folder = cache_dir / "overrides" / uuid.uuid4().hex / model_name
    folder.mkdir(parents=True)
    root = folder.resolve()
    for relative, data in files.items():
        target = folder / relative
        if not target.resolve().is_relative_to(root):
            raise InvalidArgumentError(f"file path '{relative}' would leave the model's folder")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return folder
