"""A lean HTTP/1.1 server on asyncio and httptools, shared by the REST and OpenAI frontends.

It knows HTTP, not inference: connections parsed within limits and time limits (`_connection`,
`_limits`), handlers found by method and path (`_router`) and answered in order
(`_answering`), request and answer messages (`_http_messages`), content codings (`_encoding`) and
TLS (`_tls`). Besides the standard library and its C parser it may import only coreserve's
errors and two small modules of the server around it (`frontend_reads`, `tls_files`); the
frontends that use it bring the routes.
"""

from __future__ import annotations

from coreserve.server.httpd._encoding import BodyTooLarge, UnsupportedEncoding, decompress
from coreserve.server.httpd._http_messages import HttpRequest, HttpResponse, Response, StreamedResponse
from coreserve.server.httpd._limits import (
    DEFAULT_HTTP_LIMITS,
    MAX_CONNECTIONS_CAP,
    HttpLimits,
    open_file_limit,
)
from coreserve.server.httpd._router import Handler, Router, method_not_allowed, unrouted_message
from coreserve.server.httpd._server import HttpServer
from coreserve.server.httpd._tls import HttpTls

__all__ = [
    "DEFAULT_HTTP_LIMITS",
    "MAX_CONNECTIONS_CAP",
    "BodyTooLarge",
    "Handler",
    "HttpLimits",
    "HttpRequest",
    "HttpResponse",
    "HttpServer",
    "HttpTls",
    "Response",
    "Router",
    "StreamedResponse",
    "UnsupportedEncoding",
    "decompress",
    "method_not_allowed",
    "open_file_limit",
    "unrouted_message",
]
