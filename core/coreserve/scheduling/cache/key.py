"""The key a response cache files a request under: a hash of what decides its answer.

The hash covers the model version (through a prefix), each input's name, datatype, shape and
bytes, the outputs the request asks for and the request parameters a model may read. Array
data is fed to the hash as it lies in memory (no copy for C-contiguous arrays), so hashing
costs one pass over the input bytes.
"""

from __future__ import annotations

from collections.abc import Iterable
from hashlib import blake2b
from pathlib import Path
from stat import S_ISREG as stat_is_file

from coreserve.types import InferenceRequest

# 128 bits: a collision (another request's answer) is out of reach in practice; Triton's is 64.
DIGEST_SIZE = 16
# Request parameters that change when or how a request runs, never what it answers.
SCHEDULING_PARAMETERS = frozenset({"priority", "timeout"})
# Input headers a model's cache remembers (see request_key).
MAX_HEADERS = 1024


def model_prefix(model_name: str, version: int, generation: int | str) -> bytes:
    """The part of every key of one loaded model version; a reload gets a new `generation`
    (a number in this process, or a fingerprint of the version's files in a shared cache)."""
    return f"{len(model_name)}:{model_name}:{version}:{generation}:".encode()


def version_fingerprint(model_path: Path, version: int, config_text: str, times: bool = True) -> str:
    """What identifies a model version's files across processes: its configuration and each
    file's path, size and (with `times`) modification time (not the contents: hashing a large
    model at each load would cost seconds)."""
    digest = blake2b(config_text.encode(), digest_size=8)
    folder = model_path / str(version)
    digest.update(files_digest(folder, sorted(folder.rglob("*")) if folder.is_dir() else [], times))
    return digest.hexdigest()


def files_digest(folder: Path, paths: Iterable[Path], times: bool = True) -> bytes:
    """Each file's path (relative to `folder`), size and (with `times`) modification time, as
    bytes to hash; Python's bytecode caches (a model's `__pycache__`, written once its module
    is imported) and files removed meanwhile are left out."""
    parts = []
    for path in paths:
        if "__pycache__" in path.parts:
            continue
        try:
            stat = path.stat()
        except OSError:  # (gone since the folder was listed: an editor's or a copy's temporary file)
            continue
        if stat_is_file(stat.st_mode):
            modified = stat.st_mtime_ns if times else 0
            parts.append(f"{path.relative_to(folder)}:{stat.st_size}:{modified};")
    return "".join(parts).encode()


def request_key(
    prefix: bytes,
    request: InferenceRequest,
    headers: dict[object, bytes] | None = None,
    exact_up_to: int = 0,
) -> bytes:
    """The cache key of `request` for the model version that `prefix` names.

    `headers` (optional, kept by the caller between calls) remembers the bytes that stand for
    each input's name, datatype and shape: formatting them is most of the cost for small inputs.
    When the inputs hold at most `exact_up_to` bytes (0: never), the key is the hashed material
    itself rather than its hash: no collision is possible, and joining a few short byte strings
    costs half of what hashing them does.
    """
    if headers is None:
        headers = {}
    parts: list[object] = [prefix]
    append = parts.append
    size = 0
    limit = exact_up_to if exact_up_to > 0 else -1  # (so that 0 bytes of inputs are no exception)
    inputs = request.inputs
    for name in sorted(inputs) if len(inputs) > 1 else inputs:
        array = inputs[name]
        dtype = array.dtype
        signature = (name, dtype, array.shape)
        header = headers.get(signature)
        if header is None:
            if len(headers) >= MAX_HEADERS:  # shapes a client varies must not grow it unbounded
                headers.clear()
            # Every variable-length field carries its length, so two requests never feed the
            # same bytes. (dtype.str and .char, not .name: the name costs microseconds to build.)
            header = headers[signature] = (
                f"{len(name)}:{name}:{dtype.str}{dtype.char}:{array.shape}:".encode()
            )
        append(header)
        if dtype.kind == "O":
            for element in array.reshape(-1):
                data = element if isinstance(element, bytes) else str(element).encode()
                append(len(data).to_bytes(8, "little"))
                append(data)
                size += len(data) + 8
        else:
            size += array.nbytes
            # A small array's bytes in C order; a large one is hashed from its own buffer.
            append(array.tobytes() if size <= limit else array)
    requested = request.requested_outputs
    if requested is not None:
        append(repr(requested).encode())
    parameters = request.parameters
    if parameters:
        kept = sorted((k, v) for k, v in parameters.items() if k not in SCHEDULING_PARAMETERS)
        if kept:
            append(b"\0" + repr(kept).encode())
    if size <= limit:
        return b"".join(parts)  # type: ignore[arg-type]  # bytes only: arrays went in as bytes
    digest = blake2b(digest_size=DIGEST_SIZE)
    for part in parts:
        try:
            # An array's own buffer, no copy, and no memoryview object made for it (which
            # costs more than hashing a small input).
            digest.update(part)  # type: ignore[arg-type]  # bytes or an ndarray (a buffer)
        except (ValueError, BufferError):  # not C-contiguous, or a dtype that exports no buffer
            digest.update(part.tobytes())  # type: ignore[attr-defined]  # its bytes in C order
    return digest.digest()
