"""A lean HTTP/1.1 server on asyncio and httptools (the C parser uvicorn uses).

The data plane's HTTP path is short, so the web framework around it was most of a request's
CPU time; this server does only what the v2 API needs: keep-alive, pipelined requests
answered in order, Content-Length and chunked request bodies, `Expect: 100-continue`, a
body size limit (413), compressed responses on request (`http_encoding` has the codings),
and streamed (chunked) responses for server-sent events. It protects itself with the limits
and timeouts of `HttpLimits`: each is enforced as the request is parsed, before anything
past the limit is kept.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from http import HTTPStatus

from coreserve.server.httpd._answering import reason_phrase
from coreserve.server.httpd._connection import LINGER_SECS, MAX_LINGERING_REFUSALS, HttpProtocol
from coreserve.server.httpd._http_messages import ErrorResponse, Handler
from coreserve.server.httpd._limits import (
    DEFAULT_HTTP_LIMITS,
    HttpLimits,
    RateLimitedWarning,
    default_max_connections,
    open_file_limit,
)

logger = logging.getLogger(__name__)


class _RefusedConnection(asyncio.Protocol):
    """A connection over the limit: it gets a 503, then is closed once the client saw it."""

    def __init__(self, server: HttpServer, transport: asyncio.Transport, response: bytes) -> None:
        self._server = server
        transport.set_protocol(self)
        transport.write(response)
        # Closing at once could reset the connection (the request unread) before the client
        # reads the 503: the write side is shut instead, and the client closes.
        transport.write_eof()
        server.lingering_refusals += 1
        self._timer = asyncio.get_running_loop().call_later(LINGER_SECS, transport.close)

    def data_received(self, data: bytes) -> None:
        pass  # the request: unanswered

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.lingering_refusals -= 1
        self._timer.cancel()


class HttpServer:
    """Accepts connections for `handle`; `stop` lets the requests being answered finish."""

    def __init__(
        self,
        handle: Handler,
        error_response: ErrorResponse,
        max_body_size: int,
        limits: HttpLimits = DEFAULT_HTTP_LIMITS,
    ) -> None:
        self.handle = handle
        self.error_response = error_response
        self.max_body_size = max_body_size
        self.limits = limits
        self.connection_limit = limits.connection_limit()
        # The request line and the separators of the headers come on top of their names and values.
        self.head_limit = limits.max_url_size + limits.max_header_size + 4 * limits.max_header_count + 1024
        self.header_size_message = (
            f"request header fields too large: the limit is {limits.max_header_size} bytes"
        )
        self.trailer_message = "request body framing or trailer fields too large"
        self.body_size_message = f"request body too large: the limit is {max_body_size} bytes"
        self.connections: set[HttpProtocol] = set()
        self.busy = 0
        self.stopping = False  # answers then say `Connection: close`, and their connection closes
        self._server: asyncio.Server | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self._refused = RateLimitedWarning(
            logger,
            f"HTTP: refused %d connections over the limit of {self.connection_limit} "
            "(--http-max-connections) in the last few seconds",
        )
        self._refusal: bytes | None = None
        self.lingering_refusals = 0
        files = open_file_limit()
        spare = MAX_LINGERING_REFUSALS if files is None else (files - self.connection_limit) // 4
        self._max_lingering_refusals = max(0, min(MAX_LINGERING_REFUSALS, spare))
        # Past this many connections, accept() may run out of descriptors: the system then
        # resets new clients, unseen by us, so the condition is logged as it approaches.
        self.file_safe_connections = default_max_connections()
        self.near_file_limit = RateLimitedWarning(
            logger,
            "HTTP: %d connections open, near the open-file limit (ulimit -n): new clients may be reset "
            "without an answer; lower --http-max-connections or raise the limit",
            count_events=False,
        )
        if self.connection_limit > self.file_safe_connections:
            logger.warning(
                "HTTP: --http-max-connections=%d is above 3/4 of the open-file limit (ulimit -n); "
                "past about %d connections new clients may be reset without an answer",
                self.connection_limit,
                self.file_safe_connections,
            )

    async def start(
        self, address: str, port: int, tls: ssl.SSLContext | None = None, *, reuse_port: bool = False
    ) -> int:
        """Listens; with `tls`, each connection's handshake must finish within the header timeout.
        With `reuse_port`, other sockets may bind the port too (SO_REUSEPORT)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: HttpProtocol(self),
            address,
            port,
            reuse_address=True,
            reuse_port=reuse_port or None,
            backlog=1024,
            ssl=tls,
            ssl_handshake_timeout=self.limits.header_timeout if tls is not None else None,
        )
        return int(self._server.sockets[0].getsockname()[1])

    def refuse(self, transport: asyncio.Transport) -> None:
        """Answers a connection over the limit with 503 and closes it."""
        self._refused()
        if self._refusal is None:
            error = self.error_response(
                HTTPStatus.SERVICE_UNAVAILABLE, f"too many connections: the limit is {self.connection_limit}"
            )
            self._refusal = (
                f"HTTP/1.1 503 {reason_phrase(503)}\r\nContent-Length: {len(error.body)}\r\n"
                f"Content-Type: {error.content_type}\r\nConnection: close\r\n\r\n"
            ).encode("latin-1") + error.body
        if self.lingering_refusals < self._max_lingering_refusals and transport.can_write_eof():
            _RefusedConnection(self, transport, self._refusal)
        else:
            transport.write(self._refusal)
            transport.close()

    def answered(self) -> None:
        if self.busy == 0:
            self._idle.set()
        if self.stopping:  # close the connections that went idle
            for connection in list(self.connections):
                connection.close_if_idle()

    async def stop(self, timeout: float) -> None:
        """Stops accepting, closes idle connections, waits up to `timeout` for the rest."""
        server, self._server = self._server, None
        if server is None:
            return
        self.stopping = True
        server.close()
        for connection in list(self.connections):
            connection.close_if_idle()
        if self.busy:
            self._idle.clear()
            try:
                await asyncio.wait_for(self._idle.wait(), timeout)
            except TimeoutError:
                logger.warning("HTTP: %d requests still running after %.1fs; closing", self.busy, timeout)
        for connection in list(self.connections):
            connection.close()
        await server.wait_closed()
