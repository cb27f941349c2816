"""The limits and timeouts that protect the HTTP server from slow, greedy or hostile clients.

Every default lives here (the command line shows them from `DEFAULT_HTTP_LIMITS`). Triton's
HTTP server has no flags for these; the defaults follow nginx and Apache where they have one:
100 header fields (Apache's LimitRequestFields), 60 s to send the headers and between two
reads of a body, and to take our answer (nginx's client_header_timeout, client_body_timeout,
send_timeout), 75 s of keep-alive idleness (nginx's keepalive_timeout).
"""

from __future__ import annotations

import logging
import resource
import time
from dataclasses import dataclass

# At most this many connections by default, however high the open-file limit is.
MAX_CONNECTIONS_CAP = 10_000
# The share of the open-file limit that HTTP connections may take by default; the rest is for
# gRPC, model files, stubs' sockets and the logs.
CONNECTIONS_SHARE_OF_FILE_LIMIT = 0.75


@dataclass(frozen=True)
class HttpLimits:
    """What one HTTP request and one connection may take; see the module docstring for why."""

    max_header_count: int = 100
    max_header_size: int = 64 * 1024  # bytes of all header names and values of one request
    max_url_size: int = 16 * 1024
    header_timeout: float = 60.0  # from a request's first byte (a new connection's start) to its last header
    body_timeout: float = 60.0  # between two reads of a request body
    keepalive_timeout: float = 75.0  # an idle connection, no request in progress, is closed
    write_timeout: float = 60.0  # a client that takes none of our answer for this long is dropped
    max_connections: int | None = None  # None: CONNECTIONS_SHARE_OF_FILE_LIMIT of RLIMIT_NOFILE
    max_pipelined: int = 16  # requests read ahead of their answers on one connection

    def connection_limit(self) -> int:
        """The number of concurrent connections served: the setting, or one under the file limit."""
        if self.max_connections is not None:
            return self.max_connections
        return default_max_connections()


DEFAULT_HTTP_LIMITS = HttpLimits()


def open_file_limit() -> int | None:
    """The process's limit on open file descriptors (ulimit -n), None if it has none."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def default_max_connections() -> int:
    """A connection limit below the process's open-file limit, so that accept() never fails on it."""
    limit = open_file_limit()
    if limit is None:
        return MAX_CONNECTIONS_CAP
    return max(1, min(MAX_CONNECTIONS_CAP, int(limit * CONNECTIONS_SHARE_OF_FILE_LIMIT)))


class RateLimitedWarning:
    """Logs an event at most once per `interval` seconds, with how many happened since the last line
    (or, with count_events=False, the number the caller passes)."""

    def __init__(
        self, logger: logging.Logger, message: str, interval: float = 10.0, count_events: bool = True
    ) -> None:
        self._logger = logger
        self._message = message  # a %-format taking one number
        self._interval = interval
        self._count_events = count_events
        self._count = 0
        self._last = -interval

    def __call__(self, number: int = 0) -> None:
        self._count += 1
        now = time.monotonic()
        if now - self._last >= self._interval:
            self._logger.warning(self._message, self._count if self._count_events else number)
            self._count = 0
            self._last = now
