"""Loading a model with parameters, as Triton's repository API accepts them.

`config` is a JSON model configuration that replaces config.pbtxt for this load;
`file:<path>` entries carry the model's files (`file:1/model.onnx`), which are written into a
fresh folder of the server's cache, never into the repository. As in Triton, that folder is
named by the server, not after the model, so any name a model may have loads from files.
Paths that could leave that folder, or that no file system holds (a name over 255 bytes), are
refused before anything is written; the files go to a partial folder that is renamed into
place once all are written, and removed if any write fails.

Triton 2.51 answers a `config` or a file it cannot take with INTERNAL (HTTP 500) and the words
"failed to load '<model>', failed to poll from model repository", the reason going only to its
log. The mistake is the client's, so coreserve answers 400 / INVALID_ARGUMENT, in those words
followed by the reason (Triton's where its log words it).
"""

from __future__ import annotations

import errno
import json
import logging
import re
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import orjson

from coreserve.config import ModelConfig, config_from_dict
from coreserve.errors import (
    CoreserveError,
    InternalError,
    InvalidArgumentError,
    ModelConfigError,
    NotFoundError,
)
from coreserve.repository.storage._folders import MAX_NAME_BYTES
from coreserve.repository.traffic.policy import TrafficPolicy, policy_from_document

logger = logging.getLogger(__name__)
# POSIX's PATH_MAX on Linux, macOS and the BSDs, in bytes.
MAX_PATH_BYTES = 4096
# The load parameter that sets the traffic policy a (re)load leaves (coreserve's, not Triton's).
TRAFFIC_PARAMETER = "coreserve_traffic"
# Where the files of loads from files go, under the cache folder.
OVERRIDES_FOLDER = "overrides"


def poll_failure(model_name: str, reason: str) -> str:
    """Triton's answer to a load whose model cannot be read, with the reason it logs."""
    return f"failed to load '{model_name}', failed to poll from model repository: {reason}"


def not_in_repository(name: str, on_demand: bool = False) -> CoreserveError:
    """The error of a load (`on_demand`: a request's) that names a model no repository holds."""
    if on_demand:
        return NotFoundError(f"Request for unknown model: '{name}' is not found")
    if len(name.encode()) > MAX_NAME_BYTES:  # a client's mistake, not the repository's
        return InvalidArgumentError(
            f"failed to load '{name[:64]}...': no model folder has a name of {len(name.encode())} bytes "
            f"(at most {MAX_NAME_BYTES}); a model of a longer name loads from files only"
        )
    # Triton 2.51 answers this with INTERNAL (HTTP 500), and clients may check for it.
    return InternalError(poll_failure(name, f"model '{name}' is not in the repository"))


@dataclass
class LoadOverrides:
    """What a load request replaces: the configuration, the files, or both; and (a worker of a
    server of several taking on what the others serve) the versions, in place of those the
    version policy chooses."""

    config: ModelConfig | None = None
    files: dict[str, bytes] = field(default_factory=dict)
    versions: tuple[int, ...] | None = None
    traffic: TrafficPolicy | None = None  # the policy that holds once loaded (`coreserve_traffic`)


def parse_load_parameters(model_name: str, parameters: Mapping[str, object]) -> LoadOverrides:
    """The overrides a load request's parameters make; raises InvalidArgumentError, in Triton's
    words, for parameters Triton refuses."""
    overrides = LoadOverrides()
    for key, value in parameters.items():
        if key == "config":
            if not isinstance(value, str):  # Triton's gRPC words (its HTTP answer is a 500)
                raise InvalidArgumentError(
                    "invalid value type for load parameter 'config', expected string_param."
                )
            overrides.config = _config_override(model_name, value)
        elif key.startswith("file:"):
            if not isinstance(value, bytes):
                raise InvalidArgumentError(
                    f"invalid value type for load parameter '{key}', expected bytes_param."
                )
            relative = key[len("file:") :]
            try:
                check_relative_path(relative)
            except InvalidArgumentError as exc:
                raise InvalidArgumentError(poll_failure(model_name, exc.message)) from None
            overrides.files[relative] = value
        elif key == TRAFFIC_PARAMETER:
            overrides.traffic = _traffic_override(value)
        else:
            raise InvalidArgumentError(
                f"unrecognized load parameter '{key}'. Known: config, file:<path>, {TRAFFIC_PARAMETER}"
            )
    if overrides.files and overrides.config is None:
        raise InvalidArgumentError(
            poll_failure(model_name, "Load parameter 'config' must be specified for model file override")
        )
    return overrides


def _traffic_override(value: object) -> TrafficPolicy:
    """The policy a `coreserve_traffic` load parameter carries: a JSON object, or its text."""
    if isinstance(value, str):
        try:  # read as the traffic endpoints read it: no lone surrogates, at most 1024 levels deep
            value = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise InvalidArgumentError(
                f"load parameter '{TRAFFIC_PARAMETER}' is not valid JSON: {exc}"
            ) from None
    return policy_from_document(value)


# A JSON string (kept as it is), or a bare name before a colon: an object's key left unquoted.
_STRING_OR_BARE_KEY = re.compile(r'"(?:[^"\\]|\\.)*"|([A-Za-z_][A-Za-z0-9_]*)(?=\s*:)', re.DOTALL)


def _lenient_json(text: str) -> Any:
    """JSON as protobuf's parser (Triton's, for a config override) reads it: object keys may be
    left unquoted (Triton's QA writes `direct: {...}`). The error is strict JSON's."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        quoted = _STRING_OR_BARE_KEY.sub(lambda found: f'"{found[1]}"' if found[1] else found[0], text)
        if quoted == text:
            raise
        try:
            return json.loads(quoted)
        except json.JSONDecodeError:
            pass
        raise


def _config_override(model_name: str, text: str) -> ModelConfig:
    """The configuration a `config` parameter carries; its mistakes are worded as Triton's."""
    source = "Invalid config override"  # how Triton's log begins the reason
    try:
        document = _lenient_json(text)
        orjson.dumps(document)  # what protobuf cannot take: a lone surrogate ("\\ud800"), 255+ levels
    except json.JSONDecodeError as exc:
        reason = f"{source}: not valid JSON: {exc}"
    except RecursionError:  # no configuration nests that deep
        reason = f"{source}: its JSON nests too deep"
    except TypeError as exc:
        reason = f"{source}: not valid JSON: {exc}"
    else:
        if isinstance(document, dict):
            try:
                return config_from_dict(document, source=source)
            except ModelConfigError as exc:
                reason = exc.message
        else:
            reason = f"{source}: Root element must be a message (a JSON object)"
    raise InvalidArgumentError(poll_failure(model_name, reason))


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
    """Writes the files into a new folder `<cache>/overrides/<unique>` and returns it.

    Nothing is left behind when a write fails: the files are written under
    `<unique>.partial`, renamed at the end, and the partial folder is removed on any error.
    """
    unique = uuid.uuid4().hex
    partial = cache_dir / OVERRIDES_FOLDER / f"{unique}.partial"
    try:
        partial.mkdir(parents=True)
        root = partial.resolve()
        # In path order, whatever order the request's map had: a clash names the same file each time.
        for relative, data in sorted(files.items()):
            target = partial / relative
            if not target.resolve().is_relative_to(root):
                raise InvalidArgumentError(
                    poll_failure(model_name, f"file path '{relative}' would leave the model's folder")
                )
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
            except OSError as exc:
                if exc.errno in (errno.ENAMETOOLONG, errno.ENOTDIR, errno.EISDIR, errno.EEXIST):
                    # The request's paths clash with each other or with the file system.
                    reason = f"file path '{relative[:300]}' cannot be written: {exc.strerror}"
                    raise InvalidArgumentError(poll_failure(model_name, reason)) from None
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
    return final


def is_override_folder(path: Path, cache_dir: Path) -> bool:
    """Whether `path` is a folder that write_override_files made (and unloading removes)."""
    return path.parent == cache_dir / OVERRIDES_FOLDER
