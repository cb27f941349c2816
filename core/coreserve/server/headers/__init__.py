"""What the frontends do with an inference server's request headers, as tritonserver's flags ask:
restricted APIs (`--http-restricted-api`, `--grpc-restricted-protocol`: `_restrictions`) and
headers forwarded to the model (`--http-header-forward-pattern`, `--grpc-header-forward-pattern`:
`_forwarding`)."""

from __future__ import annotations

from coreserve.server.headers._forwarding import HeaderForwarding, checked_pattern
from coreserve.server.headers._restrictions import (
    CATEGORIES,
    GRPC_HEADER_PREFIX,
    ApiRestrictions,
    Restriction,
    parse_restriction,
)

__all__ = [
    "CATEGORIES",
    "GRPC_HEADER_PREFIX",
    "ApiRestrictions",
    "HeaderForwarding",
    "Restriction",
    "checked_pattern",
    "parse_restriction",
]
