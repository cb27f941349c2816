"""Restricted APIs, as tritonserver's `--http-restricted-api` / `--grpc-restricted-protocol`.

`--http-restricted-api model-repository,statistics:admin-key=secret` makes the endpoints of
those categories answer only requests that carry the header `admin-key: secret`; others get
403. Over gRPC, as in Triton, the metadata key is prefixed: `--grpc-restricted-protocol
statistics:admin-key=secret` wants `triton-grpc-protocol-admin-key: secret`, else
UNAVAILABLE (Triton 2.51's code). The refusals are in Triton's words.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from coreserve.errors import InvalidArgumentError, PermissionDeniedError, UnavailableError

# gRPC metadata keys are lowercase HTTP/2 headers; Triton prefixes the restricted key with this.
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"

CATEGORIES = (
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
)


@dataclass(frozen=True)
class Restriction:
    categories: frozenset[str]
    key: str
    value: str


def parse_restriction(text: str, feature: str = "api") -> Restriction:
    """`<category>[,<category>…]:<key>=<value>`; `feature` names the categories in Triton's
    words: an HTTP "api", a gRPC "protocol"."""
    categories, colon, setting = text.partition(":")
    key, equals, value = setting.partition("=")
    names = frozenset(name.strip() for name in categories.split(",") if name.strip())
    if not colon or not equals or not key or not value or not names:
        raise InvalidArgumentError(f"expected <category>[,<category>...]:<key>=<value>, got '{text}'")
    unknown = sorted(names - set(CATEGORIES))
    if unknown:
        raise InvalidArgumentError(  # Triton's words, then the known ones
            f"unknown restricted {feature} '{unknown[0]}'; known: {', '.join(CATEGORIES)}"
        )
    return Restriction(names, key.strip().lower(), value)


class ApiRestrictions:
    """The restrictions of one frontend, checked per request against its headers."""

    def __init__(self, restrictions: Iterable[Restriction] = (), grpc: bool = False) -> None:
        """`grpc`: a gRPC frontend's (metadata keys prefixed, Triton's gRPC code and words)."""
        self._grpc = grpc
        self._header_prefix = GRPC_HEADER_PREFIX if grpc else ""
        self._by_category: dict[str, Restriction] = {}
        for restriction in restrictions:
            for category in restriction.categories:
                self._by_category[category] = restriction

    def __bool__(self) -> bool:
        return bool(self._by_category)

    def check(self, category: str, headers: Mapping[str, str]) -> None:
        restriction = self._by_category.get(category)
        if restriction is None:
            return
        header = self._header_prefix + restriction.key
        if headers.get(header) == restriction.value:
            return
        if self._grpc:
            raise UnavailableError(f"This protocol is restricted, expecting header '{header}' ({category})")
        raise PermissionDeniedError(f"This API is restricted, expecting header '{header}' ({category})")
