"""Driving the HTTP server in-process: a trivial handler that records, and a raw HTTP/1.1 reader.

`RecordingHandler` answers every request with its own method, path and body, and records when
each call began and ended; a path listed in `holds` waits for the test to release it. The
server runs on the test's event loop and the client is an asyncio stream on the same loop, so
a test sees exactly which bytes went out, in which order, without any sleep.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from coreserve.server.httpd._http_messages import HttpRequest, HttpResponse, Response, StreamedResponse
from coreserve.server.httpd._limits import HttpLimits
from coreserve.server.httpd._server import HttpServer
from coreserve.server.rest._frontend import error_response


class RecordingHandler:
    """Echoes each request as `METHOD PATH BODY`; records `begin PATH` and `end PATH`."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.requests: list[HttpRequest] = []
        self.holds: dict[str, asyncio.Event] = {}
        self.streams: dict[str, list[bytes]] = {}  # path -> chunks of a streamed answer
        self.failing: set[str] = set()  # paths whose handler raises

    async def __call__(self, request: HttpRequest) -> Response:
        self.requests.append(request)
        self.events.append(f"begin {request.path}")
        try:
            hold = self.holds.get(request.path)
            if hold is not None:
                await hold.wait()
            if request.path in self.failing:
                raise RuntimeError(f"the handler of {request.path} broke")
            if request.path in self.streams:
                return StreamedResponse(_chunks(self.streams[request.path]), headers={"X-Path": request.path})
            body = f"{request.method} {request.path} ".encode() + request.body
            return HttpResponse(200, body, "text/plain", compress=request.path.startswith("/zip"))
        finally:
            self.events.append(f"end {request.path}")


async def _chunks(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        await asyncio.sleep(0)
        yield chunk


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]  # names in lower case
    body: bytes
    chunk_sizes: list[int]  # the sizes of a chunked body's chunks, in order ([] if not chunked)


async def read_response(reader: asyncio.StreamReader) -> RawResponse:
    """Reads one HTTP/1.1 response, its body framed by Content-Length or chunked."""
    status_line = await reader.readuntil(b"\r\n")
    status = int(status_line.split(b" ")[1])
    headers: dict[str, str] = {}
    while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding") == "chunked":
        body, sizes = b"", []
        while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
            sizes.append(size)
            body += await reader.readexactly(size)
            assert await reader.readexactly(2) == b"\r\n"
        assert await reader.readexactly(2) == b"\r\n"  # no trailer fields
        return RawResponse(status, headers, body, sizes)
    return RawResponse(status, headers, await reader.readexactly(int(headers["content-length"])), [])


@dataclass
class RunningServer:
    server: HttpServer
    port: int

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.port)


@asynccontextmanager
async def serving(
    handler: RecordingHandler, *, max_body_size: int = 1 << 20, limits: HttpLimits | None = None
) -> AsyncIterator[RunningServer]:
    """The HTTP server for `handler` on an ephemeral 127.0.0.1 port, stopped on the way out."""
    server = HttpServer(handler, error_response, max_body_size, limits or HttpLimits())
    port = await server.start("127.0.0.1", 0)
    try:
        yield RunningServer(server, port)
    finally:
        await server.stop(timeout=30)


def get(path: str, *, headers: str = "") -> bytes:
    """A GET request's bytes (`headers`: extra header lines, each ending in CRLF)."""
    return f"GET {path} HTTP/1.1\r\nHost: test\r\n{headers}\r\n".encode()


def post(path: str, body: bytes, *, headers: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Length: {len(body)}\r\n{headers}\r\n".encode() + body
    )


Scenario = Callable[[RunningServer, RecordingHandler], Awaitable[None]]


def run_with_server(
    scenario: Scenario, *, max_body_size: int = 1 << 20, limits: HttpLimits | None = None
) -> RecordingHandler:
    """Runs `scenario` against a server of a new RecordingHandler; returns the handler.

    The whole run is bounded, so that a hang fails the test.
    """
    handler = RecordingHandler()

    async def main() -> None:
        async with serving(handler, max_body_size=max_body_size, limits=limits) as running:
            await scenario(running, handler)

    asyncio.run(asyncio.wait_for(main(), 60))
    return handler
