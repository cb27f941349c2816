"""KServe v2 over HTTP answered by an in-process server, for an HTTP server that is not coreserve's."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

from coreserve.inprocess._loop import LoopThread
from coreserve.server.httpd import HttpRequest, HttpResponse
from coreserve.server.rest import HttpFrontend


@dataclass
class HttpAnswer:
    """One HTTP response: a whole `body`, or `chunks` to stream (generate_stream)."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)  # Content-Type included
    body: bytes = b""
    chunks: AsyncIterator[bytes] | None = None


class HttpBridge:
    """The v2 REST API of one server (the routes, codecs and errors of its HTTP frontend) as a call.

    Ray Serve's proxy, or any ASGI server, hands each request to `handle` and writes the
    answer itself; the frontend's socket server is never started.
    """

    def __init__(self, frontend: HttpFrontend, loop: LoopThread) -> None:
        self._frontend = frontend
        self._loop = loop

    async def handle(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> HttpAnswer:
        """Answers one request on the caller's event loop (the work runs on the server's).

        :param path: the request's path as sent (percent-encoded), with or without a query.
        :param headers: header names in any case.
        """
        request = HttpRequest(
            method.upper(),
            path.partition("?")[0],
            {name.lower(): value for name, value in headers.items()},
            body,
        )
        answer = await self._loop.call(self._frontend.handle(request))
        if isinstance(answer, HttpResponse):
            answer_headers = dict(answer.headers)
            if answer.content_type is not None:
                answer_headers["content-type"] = answer.content_type
            # A large encoded answer is a bytearray; bytes() copies only that one.
            return HttpAnswer(answer.status, answer_headers, body=bytes(answer.body))
        return HttpAnswer(answer.status, dict(answer.headers), chunks=self._loop.across(answer.chunks))
