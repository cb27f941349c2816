"""Model repositories in object storage (s3://, gs://, as://, …) through fsspec.

Models are copied into a local cache folder before they load; only files whose size or
version changed are fetched again. What each URL form means, and where its credentials come
from, is `coreserve.repository.storage._stores`'s business.

Needs the extras of core-server: `pip install 'core-server[s3]'`, `'core-server[gcs]'` or
`'core-server[azure]'`.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from coreserve.errors import InvalidArgumentError, NotFoundError, UnavailableError
from coreserve.repository.storage._folders import check_model_name, fingerprint
from coreserve.repository.storage._stores import StoreLocation, store_location

logger = logging.getLogger(__name__)
EXTRAS = {
    "s3": "core-server[s3]",
    "gs": "core-server[gcs]",
    "gcs": "core-server[gcs]",
    "as": "core-server[azure]",
}
PROGRESS_BYTES = 16 * 1024 * 1024


class RemoteSource:
    """A repository under a URL prefix of an fsspec filesystem."""

    copies_files = True

    def __init__(self, url: str, cache_dir: Path) -> None:
        self.label = url
        scheme = url.partition("://")[0]
        self.location = location = store_location(url, os.environ)
        self.prefix = location.prefix
        try:
            self.fs = _filesystem(location)
        except ImportError as exc:
            extra = EXTRAS.get(scheme)
            # fsspec's own words name the package of the schemes that we have no extra for
            hint = f"pip install '{extra}'" if extra else str(exc)
            raise InvalidArgumentError(
                f"model repository {url} needs {exc.name or 'a filesystem package'}: {hint}"
            ) from None
        except ValueError as exc:
            raise InvalidArgumentError(f"model repository {url}: {location.redact(str(exc))}") from None
        for name in location.chatty_loggers:
            logging.getLogger(name).setLevel(logging.WARNING)
        self.cache = cache_dir / hashlib.sha256(url.encode()).hexdigest()[:16]

    def _listing(self) -> dict[str, dict[str, Any]]:
        self.fs.invalidate_cache()  # a poll must see what changed since the last listing
        try:
            try:
                found = self.fs.find(self.prefix, detail=True)
            except FileNotFoundError:  # gcsfs's word for a missing bucket ("b/NAME/o")
                found = {}
            # adlfs finds nothing in a missing container, as s3fs in a missing bucket
            missing = not found and not self.fs.exists(self.location.bucket)
        except Exception as exc:  # each filesystem has its own errors (botocore's are no OSError)
            raise UnavailableError(
                f"cannot list model repository {self.label}: {self._describe(exc)}"
            ) from None
        if missing:
            location = self.location
            owner = f" in {location.owner}" if location.owner else ""
            raise NotFoundError(
                f"model repository {self.label}: the {location.bucket_word} '{location.bucket}' "
                f"does not exist{owner}"
            )
        return {
            path[len(self.prefix) + 1 :]: info for path, info in found.items() if info.get("type") == "file"
        }

    @staticmethod
    def _version_of(info: dict[str, Any]) -> object:
        return (
            info.get("ETag")
            or info.get("etag")
            or info.get("md5Hash")
            or info.get("mtime")
            or info.get("LastModified")
        )

    def scan(self) -> dict[str, str]:
        by_model: dict[str, list[tuple[str, int, object]]] = {}
        for relative, info in self._listing().items():
            model, _, inner = relative.partition("/")
            if inner and not model.startswith("."):
                by_model.setdefault(model, []).append(
                    (inner, int(info.get("size") or 0), self._version_of(info))
                )
        return {model: fingerprint(entries) for model, entries in sorted(by_model.items())}

    def local_path(self, name: str) -> Path:
        """Brings the model's folder up to date in the cache and returns it."""
        check_model_name(name)
        wanted = {
            relative.partition("/")[2]: info
            for relative, info in self._listing().items()
            if relative.partition("/")[0] == name and relative.partition("/")[2]
        }
        if not wanted:
            raise NotFoundError(f"model '{name}' is not in the repository {self.label}")
        folder = self.cache / name
        manifest = folder / ".coreserve-manifest"
        known = (
            dict(line.split("\t", 1) for line in manifest.read_text().splitlines())
            if manifest.exists()
            else {}
        )
        current = {}
        for inner, info in wanted.items():
            target = folder / inner
            if not target.resolve().is_relative_to(folder.resolve()):
                raise InvalidArgumentError(
                    f"model '{name}': remote file '{inner}' would leave the cache folder"
                )
            stamp = f"{info.get('size')}:{self._version_of(info)}"
            current[inner] = stamp
            if known.get(inner) == stamp and target.exists():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            size = int(info.get("size") or 0)
            started = time.monotonic()
            if size >= PROGRESS_BYTES:
                logger.info("model '%s': downloading %s (%.1f MiB)", name, inner, size / 2**20)
            try:
                self.fs.get(f"{self.prefix}/{name}/{inner}", str(target))
            except Exception as exc:
                raise UnavailableError(
                    f"model '{name}': cannot fetch {inner} from {self.label}: {self._describe(exc)}"
                ) from None
            if size >= PROGRESS_BYTES:
                logger.info("model '%s': downloaded %s in %.1f s", name, inner, time.monotonic() - started)
        for stale in set(known) - set(current):
            (folder / stale).unlink(missing_ok=True)
        manifest.parent.mkdir(parents=True, exist_ok=True)
        manifest.write_text("\n".join(f"{key}\t{value}" for key, value in sorted(current.items())))
        return folder

    def remove_cached(self, name: str) -> None:
        shutil.rmtree(self.cache / name, ignore_errors=True)

    def _describe(self, error: Exception) -> str:
        """The error's type and first line (Azure's go on with the server's whole XML answer),
        naming the account where the URL form has one, and never a secret."""
        first = (str(error).strip().splitlines() or [""])[0]
        owner = f" ({self.location.owner})" if self.location.owner else ""
        return self.location.redact(f"{type(error).__name__}{owner}: {first}")


def _filesystem(location: StoreLocation) -> Any:
    if location.filesystem is None:
        import fsspec

        return fsspec.filesystem(location.protocol, **location.options)
    module, _, name = location.filesystem.rpartition(".")
    return getattr(importlib.import_module(module), name)(**location.options)
