"""Restricted APIs, as tritonserver's `--http-restricted-api` / `--grpc-restricted-api`.

`--http-restricted-api model-repository,statistics:admin-key=secret` makes the endpoints of
those categories answer only requests that carry the header `admin-key: secret` (gRPC: the
metadata key); others get 403 / PERMISSION_DENIED.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from coreserve.errors import InvalidArgumentError, PermissionDeniedError

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


def parse_restriction(text: str) -> Restriction:
    """`<category>[,<category>…]:<key>=<value>`."""
    categories, colon, setting = text.partition(":")
    key, equals, value = setting.partition("=")
    names = frozenset(name.strip() for name in categories.split(",") if name.strip())
    if not colon or not equals or not key or not names:
        raise InvalidArgumentError(f"expected <category>[,<category>...]:<key>=<value>, got '{text}'")
    unknown = sorted(names - set(CATEGORIES))
    if unknown:
        raise InvalidArgumentError(f"unknown API categories {unknown}; known: {', '.join(CATEGORIES)}")
    return Restriction(names, key.strip().lower(), value)


class ApiRestrictions:
    """The restrictions of one frontend, checked per request against its headers."""

    def __init__(self, restrictions: Iterable[Restriction] = ()) -> None:
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
        if headers.get(restriction.key) != restriction.value:
            raise PermissionDeniedError(
                f"this API ({category}) is restricted: send the header '{restriction.key}' with its value"
            )
