"""Headers forwarded to the model as request parameters: tritonserver's
`--http-header-forward-pattern` and `--grpc-header-forward-pattern`.

As in Triton, each header (HTTP) or metadata key (gRPC) of an inference request whose name the
pattern matches anywhere, in any case (unless it starts with RE2's `(?-i)`), becomes a string
parameter of that request under its name (here always lower case, as HTTP/2 writes names;
HTTP/1.1's are read so). Triton forwards them on HTTP `…/infer` and on gRPC `ModelInfer` and
`ModelStreamInfer`. A matched header named as one of Triton's reserved parameters fails the
request, in the words of Triton's releases after 2.51 (2.51 forwarded it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from coreserve.errors import InvalidArgumentError
from coreserve.types import REQUEST_FIELDS, InferenceRequest

# RE2's flag that makes the rest of a pattern case-sensitive (Triton's patterns are RE2's);
# Python's `re` takes it only scoped, `(?-i:...)`.
CASE_SENSITIVE = "(?-i)"
# Triton's kReservedParameterKeys; a name that starts with "triton_" is reserved too.
RESERVED_NAMES = REQUEST_FIELDS | {"headers", "binary_data_output"}


def _compiled(pattern: str) -> re.Pattern[str]:
    """The pattern as Triton matches it: in any case, unless it starts with `(?-i)`."""
    if pattern.startswith(CASE_SENSITIVE):
        return re.compile(pattern.removeprefix(CASE_SENSITIVE))
    return re.compile(pattern, re.IGNORECASE)


def checked_pattern(text: str) -> str:
    """`text` if it is a regular expression; ValueError naming the mistake otherwise."""
    try:
        _compiled(text)
    except re.error as exc:
        raise ValueError(f"not a regular expression: {exc}") from None
    return text


class HeaderForwarding:
    """One frontend's pattern ("": nothing is forwarded)."""

    def __init__(self, pattern: str = "") -> None:
        self._regex = _compiled(pattern) if pattern else None

    def __bool__(self) -> bool:
        return self._regex is not None

    def forward(self, headers: Iterable[tuple[str, str]], request: InferenceRequest) -> None:
        """Adds the matching headers to the request's parameters (a header wins over a body
        parameter of the same name, as the later of Triton's two parameters would). Raises
        InvalidArgumentError for a matching header named as a reserved parameter (a request's
        own fields such as `priority`, `headers`, `binary_data_output`, `triton_*`): a header
        never changes how a request runs."""
        regex = self._regex
        if regex is None:
            return
        for name, value in headers:
            if not regex.search(name):
                continue
            key = name.lower()
            if key in RESERVED_NAMES or key.startswith("triton_"):
                raise InvalidArgumentError(
                    f"Header '{name}' is reserved for Triton usage and cannot be forwarded."
                )
            request.parameters[key] = value
