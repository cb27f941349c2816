"""What a remote `--model-repository` URL names: an fsspec filesystem, its options, a path.

Triton's URL forms are read as Triton reads them:

- `s3://bucket/prefix`, or `s3://host:port/bucket/prefix` for an S3-compatible endpoint
  (http://host:port); credentials from the AWS environment (AWS_ACCESS_KEY_ID…).
- `gs://bucket/prefix`; credentials from Google's environment (GOOGLE_APPLICATION_CREDENTIALS…).
  Where STORAGE_EMULATOR_HOST names an emulator, gcsfs's plain filesystem is used: its
  experimental one asks Google's storage-control gRPC API, which emulators do not serve, for
  every bucket's layout (a timeout of a minute per call).
- `as://account/container/prefix` (Azure Blob Storage, through adlfs); credentials from
  AZURE_STORAGE_CONNECTION_STRING (whose `BlobEndpoint=` may name another endpoint, such as an
  emulator's), else AZURE_STORAGE_ACCOUNT with AZURE_STORAGE_KEY as Triton reads them, else
  Azure's DefaultAzureCredential (managed identity, AZURE_CLIENT_ID…, `az login`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from coreserve.errors import InvalidArgumentError

_ENDPOINT = re.compile(r"^(?P<host>[^/:]+:\d+)/(?P<rest>.+)$")
# Azure's naming rules: accounts are 3-24 lower-case letters and digits; containers 3-63 of
# lower-case letters, digits and single inner hyphens.
_AZURE_ACCOUNT = re.compile(r"^[a-z0-9]{3,24}$")
_AZURE_CONTAINER = re.compile(r"^[a-z0-9](?:-?[a-z0-9]){2,62}$")
AZURE_FORM = "as://ACCOUNT/CONTAINER[/PATH]"
# Fields of an Azure connection string whose values are secrets.
_AZURE_SECRET_FIELDS = ("accountkey", "sharedaccesssignature")
# Azure's SDK logs each request and response, headers and all, at INFO.
_AZURE_LOGGERS = ("azure.core.pipeline.policies.http_logging_policy", "azure.identity")


@dataclass(frozen=True)
class StoreLocation:
    """A remote repository: the filesystem that reads it and where in it the models are."""

    protocol: str
    """The fsspec protocol ("s3", "gs", "az")."""
    prefix: str
    """The repository's path in the filesystem: bucket (or container), then the folders."""
    options: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the filesystem."""
    filesystem: str | None = None
    """`module.Class` to use instead of the protocol's registered filesystem."""
    bucket_word: str = "bucket"
    """What the first part of `prefix` is called in this storage."""
    owner: str = ""
    """Who holds the bucket, for messages ("Azure Storage account 'x'"); empty where it says nothing."""
    secrets: tuple[str, ...] = ()
    """Values that no message may repeat."""
    chatty_loggers: tuple[str, ...] = ()
    """Loggers of the filesystem's SDK that log every request at INFO: kept to warnings."""

    @property
    def bucket(self) -> str:
        return self.prefix.partition("/")[0]

    def redact(self, text: str) -> str:
        """`text` with every secret of the location replaced."""
        for secret in self.secrets:
            text = text.replace(secret, "<secret>")
        return text


def store_location(url: str, environ: Mapping[str, str]) -> StoreLocation:
    """The location a remote `--model-repository` URL names, with credentials from `environ`."""
    protocol, _, rest = url.partition("://")
    if protocol == "as":
        return _azure(url, rest, environ)
    if protocol == "s3":
        match = _ENDPOINT.match(rest)
        if match:
            options = {"client_kwargs": {"endpoint_url": f"http://{match['host']}"}}
            return StoreLocation("s3", match["rest"].rstrip("/"), options)
    if protocol in ("gs", "gcs") and environ.get("STORAGE_EMULATOR_HOST"):
        return StoreLocation(protocol, rest.rstrip("/"), filesystem="gcsfs.core.GCSFileSystem")
    return StoreLocation(protocol, rest.rstrip("/"))


def _azure(url: str, rest: str, environ: Mapping[str, str]) -> StoreLocation:
    account, _, path = rest.partition("/")
    container = path.partition("/")[0]
    if not account or not container:
        raise InvalidArgumentError(
            f"model repository {url}: an Azure Storage URL names an account and a container: {AZURE_FORM}"
        )
    if not _AZURE_ACCOUNT.match(account):
        raise InvalidArgumentError(
            f"model repository {url}: '{account}' is not an Azure Storage account name "
            "(3 to 24 lower-case letters and digits)"
        )
    if not _AZURE_CONTAINER.match(container):
        raise InvalidArgumentError(
            f"model repository {url}: '{container}' is not an Azure Storage container name "
            "(3 to 63 lower-case letters, digits and single hyphens)"
        )
    owner = f"Azure Storage account '{account}'"
    prefix = path.rstrip("/")
    connection_string = environ.get("AZURE_STORAGE_CONNECTION_STRING", "")
    if connection_string:
        fields = _connection_string_fields(connection_string)
        named = fields.get("accountname", account)
        if named != account:
            raise InvalidArgumentError(
                f"model repository {url}: AZURE_STORAGE_CONNECTION_STRING is for the account "
                f"'{named}', the URL names the account '{account}'"
            )
        secrets = tuple(fields[name] for name in _AZURE_SECRET_FIELDS if fields.get(name))
        options: dict[str, Any] = {"connection_string": connection_string}
        return _azure_location(prefix, options, owner, secrets)
    key = environ.get("AZURE_STORAGE_KEY", "")
    if key:
        named = environ.get("AZURE_STORAGE_ACCOUNT", account)
        if named != account:
            raise InvalidArgumentError(
                f"model repository {url}: AZURE_STORAGE_KEY is the key of the account '{named}' "
                f"(AZURE_STORAGE_ACCOUNT), the URL names the account '{account}'"
            )
        options = {"account_name": account, "account_key": key}
        return _azure_location(prefix, options, owner, (key,))
    # adlfs asks DefaultAzureCredential (or reads anonymously where AZURE_STORAGE_ANON is set).
    return _azure_location(prefix, {"account_name": account}, owner, ())


def _azure_location(
    prefix: str, options: dict[str, Any], owner: str, secrets: tuple[str, ...]
) -> StoreLocation:
    return StoreLocation(
        "az",
        prefix,
        options,
        bucket_word="container",
        owner=owner,
        secrets=secrets,
        chatty_loggers=_AZURE_LOGGERS,
    )


def _connection_string_fields(text: str) -> dict[str, str]:
    """An Azure connection string's `Name=value;…` fields, by lower-case name."""
    fields = {}
    for part in text.split(";"):
        name, sep, value = part.partition("=")
        if sep:
            fields[name.strip().lower()] = value.strip()
    return fields
