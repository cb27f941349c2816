"""Routing of HTTP requests: which handler serves a method and path."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from urllib.parse import unquote

from coreserve.server.httpd._http_messages import ErrorResponse, HttpRequest, HttpResponse, Response

Handler = Callable[[HttpRequest], Awaitable[Response]]
# What a `{name}` segment matches: a model version is digits only, as in Triton's routes, so
# `/versions/abc/...` is no endpoint at all (404) rather than a request with a bad version.
_SEGMENT = {"version": "[0-9]+"}
_ANY_SEGMENT = "[^/]+"
_MALFORMED_VERSION = re.compile(r"^/v2/models/[^/]+/versions/(?P<version>[^/]*)(/|$)")


class Router:
    """Finds the handler of a method and path; `{name}` segments become match_info entries.

    Clients call the same few paths over and over, so resolved paths are remembered (up to
    CACHE_SIZE of them) and a repeated path skips the patterns.
    """

    CACHE_SIZE = 4096

    def __init__(self) -> None:
        self._routes: list[tuple[str, re.Pattern[str], Handler]] = []
        self._resolved: dict[tuple[str, str], tuple[Handler, dict[str, str]] | None] = {}

    def add(self, method: str, path: str, handler: Handler) -> None:
        pattern = re.sub(
            r"\\\{(\w+)\\\}",
            lambda match: f"(?P<{match[1]}>{_SEGMENT.get(match[1], _ANY_SEGMENT)})",
            re.escape(path),
        )
        self._routes.append((method, re.compile(f"^{pattern}$"), handler))
        self._resolved.clear()

    def resolve(self, request: HttpRequest) -> Handler | None:
        key = (request.method, request.path)
        try:
            found = self._resolved[key]
        except KeyError:
            found = self._match(*key)
            if len(self._resolved) >= self.CACHE_SIZE:
                self._resolved.clear()
            self._resolved[key] = found
        if found is None:
            return None
        handler, match_info = found
        request.match_info = dict(match_info)
        return handler

    def allowed_methods(self, path: str) -> list[str]:
        """The methods the routes serve at `path`: for a request no route serves, none (404) or
        those its 405 allows."""
        return sorted({method for method, pattern, _ in self._routes if pattern.match(path)})

    def _match(self, method: str, path: str) -> tuple[Handler, dict[str, str]] | None:
        for route_method, pattern, handler in self._routes:
            if route_method != method:
                continue
            match = pattern.match(path)
            if match is not None:
                return handler, {name: unquote(value) for name, value in match.groupdict().items()}
        return None


def method_not_allowed(methods: list[str], error_response: ErrorResponse) -> HttpResponse:
    """Triton's 405 and words for a path that other methods are served at, with the Allow header
    HTTP asks of a 405 (Triton sends none)."""
    response = error_response(405, "Method Not Allowed")
    response.headers["Allow"] = ", ".join(methods)
    return response


def unrouted_message(method: str, path: str) -> str:
    """Why no endpoint serves a method and path: Triton's "Not Found" where a model version in
    the path is not a number (Triton's routes take digits only), our own words otherwise."""
    malformed = _MALFORMED_VERSION.match(path)
    if malformed is not None:
        version = unquote(malformed["version"])[:50]
        return f"Not Found: '{version}' is not a model version (a version in the path is a number)"
    return f"unknown endpoint: {method} {_quoted_path(path)}"


def _quoted_path(path: str, limit: int = 200) -> str:
    """The path as an error message quotes it: a long one cut short, so that it is not echoed whole."""
    return path if len(path) <= limit else f"{path[:limit]}… ({len(path)} characters)"
