"""Model repositories in object storage (s3://, gs://, …) through fsspec.

Models are copied into a local cache folder before they load; only files whose size or
version changed are fetched again. Credentials come from the usual environment of each
filesystem (AWS_ACCESS_KEY_ID…, GOOGLE_APPLICATION_CREDENTIALS…). As in Triton, an S3 URL
may name its endpoint: `s3://host:port/bucket/prefix` talks to http://host:port.

Needs the extras of core-server: `pip install 'core-server[s3]'` or `'core-server[gcs]'`.
"""

from __future__ import annotations

import hashlib
import logging
import re
import shutil
import time
from pathlib import Path
from typing import Any

from coreserve.errors import InvalidArgumentError, NotFoundError, UnavailableError
from coreserve.repository.folders import check_model_name, fingerprint

logger = logging.getLogger(__name__)
EXTRAS = {"s3": "core-server[s3]", "gs": "core-server[gcs]", "gcs": "core-server[gcs]"}
_ENDPOINT = re.compile(r"^(?P<host>[^/:]+:\d+)/(?P<rest>.+)$")
PROGRESS_BYTES = 16 * 1024 * 1024


class RemoteSource:
    """A repository under a URL prefix of an fsspec filesystem."""

    def __init__(self, url: str, cache_dir: Path) -> None:
        self.label = url
        protocol, _, rest = url.partition("://")
        options: dict[str, Any] = {}
        match = _ENDPOINT.match(rest)
        if protocol == "s3" and match:
            options["client_kwargs"] = {"endpoint_url": f"http://{match['host']}"}
            rest = match["rest"]
        self.prefix = rest.rstrip("/")
        try:
            import fsspec

            self.fs = fsspec.filesystem(protocol, **options)
        except ImportError as exc:
            extra = EXTRAS.get(protocol, "the fsspec filesystem for " + protocol)
            raise InvalidArgumentError(
                f"model repository {url} needs {exc.name or 'a filesystem package'}: pip install '{extra}'"
            ) from None
        except ValueError as exc:
            raise InvalidArgumentError(f"model repository {url}: {exc}") from None
        self.cache = cache_dir / hashlib.sha256(url.encode()).hexdigest()[:16]

    def _listing(self) -> dict[str, dict[str, Any]]:
        try:
            found = self.fs.find(self.prefix, detail=True)
        except Exception as exc:  # each filesystem has its own errors (botocore's are no OSError)
            raise UnavailableError(f"cannot list model repository {self.label}: {_describe(exc)}") from None
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
                    f"model '{name}': cannot fetch {inner} from {self.label}: {_describe(exc)}"
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


def _describe(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"
