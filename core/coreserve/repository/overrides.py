"""Loading a model with parameters, as Triton's repository API accepts them.

`config` is a JSON model configuration that replaces config.pbtxt for this load;
`file:<path>` entries carry the model's files (`file:1/model.onnx`), which are written into a
fresh folder of the server's cache, never into the repository. Paths that could leave that
folder, or that no file system holds (a name over 255 bytes), are refused before anything is
written; the files go to a partial folder that is renamed into place once all are written,
and removed if any write fails.
"""

from __future__ import annotations

import errno
import json
import logging
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from coreserve.config import ModelConfig, config_from_dict
from coreserve.errors import InternalError, InvalidArgumentError

logger = logging.getLogger(__name__)
# POSIX's NAME_MAX and PATH_MAX on Linux, macOS and the BSDs, in bytes.
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4096


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
            except RecursionError:  # no configuration nests that deep
                raise InvalidArgumentError("load parameter 'config' nests too deep") from None
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
    """Refuses paths that are absolute, climb out, hide a NUL byte, or are too long to write."""
    shown = relative if len(relative) <= 300 else relative[:300] + "..."
    try:
        size = len(relative.encode())
    except UnicodeEncodeError:
        raise InvalidArgumentError(f"file path {shown!r} is not valid text") from None
    parts = PurePosixPath(relative).parts
    if (
        not relative
        or "\x00" in relative
        or "\\" in relative
        or relative.startswith("/")
        or any(part in ("..", ".", "") for part in relative.split("/"))
        or not parts
    ):
        raise InvalidArgumentError(f"file path '{shown}' is not a relative path inside the model's folder")
    if size > MAX_PATH_BYTES // 2:  # leaves room for the cache folder's own path
        raise InvalidArgumentError(f"file path '{shown}' is longer than {MAX_PATH_BYTES // 2} bytes")
    for part in parts:
        if len(part.encode()) > MAX_NAME_BYTES:
            raise InvalidArgumentError(
                f"file path '{shown}' has a name of {len(part.encode())} bytes; "
                f"file systems hold at most {MAX_NAME_BYTES}"
            )


def write_override_files(cache_dir: Path, model_name: str, files: Mapping[str, bytes]) -> Path:
    """Writes the files into a new folder `<cache>/overrides/<unique>/<model>` and returns it.

    Nothing is left behind when a write fails: the files are written under
    `<unique>.partial`, renamed at the end, and the partial folder is removed on any error.
    """
    unique = uuid.uuid4().hex
    partial = cache_dir / "overrides" / f"{unique}.partial"
    try:
        folder = partial / model_name
        folder.mkdir(parents=True)
        root = folder.resolve()
        for relative, data in files.items():
            target = folder / relative
            if not target.resolve().is_relative_to(root):
                raise InvalidArgumentError(f"file path '{relative}' would leave the model's folder")
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
            except OSError as exc:
                if exc.errno in (errno.ENAMETOOLONG, errno.ENOTDIR, errno.EISDIR, errno.EEXIST):
                    # The request's paths clash with each other or with the file system.
                    raise InvalidArgumentError(
                        f"file path '{relative[:300]}' cannot be written: {exc.strerror}"
                    ) from None
                raise
        final = partial.with_name(unique)
        partial.rename(final)
    except InvalidArgumentError:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    except OSError as exc:  # the cache itself failed (full disk, permissions): a server fault
        shutil.rmtree(partial, ignore_errors=True)
        logger.error("cannot write the files of model '%s' to the cache %s: %s", model_name, cache_dir, exc)
        raise InternalError(f"cannot write the files of model '{model_name}' to the cache: {exc}") from None
    return final / model_name
