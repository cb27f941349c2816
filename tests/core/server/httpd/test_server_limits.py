"""The HTTP server's limits in-process: sizes refused with their status, timeouts, connections.

The timeouts here are the behaviour under test, so they are real (a fraction of a second);
the tests assert what the client receives when one runs out, never how long it took.
"""

from __future__ import annotations

import asyncio

import orjson
import pytest

from coreserve.server.httpd._limits import HttpLimits

from .http_server_doubles import RecordingHandler, RunningServer, get, read_response, run_with_server

SHORT = 0.2  # seconds: a timeout the tests let run out


async def _refusal(running: RunningServer, request: bytes) -> tuple[int, str, bool]:
    """Sends `request`; returns the status, the error message and whether the server closed."""
    reader, writer = await running.connect()
    try:
        writer.write(request)
        answer = await read_response(reader)
        closed = answer.headers.get("connection") == "close" and await reader.read() == b""
        return answer.status, orjson.loads(answer.body)["error"], closed
    finally:
        writer.close()
        await writer.wait_closed()


@pytest.mark.parametrize(
    ("request_bytes", "status", "message"),
    [
        (get("/" + "u" * 200), 414, "URI too long: the limit is 100 bytes"),
        (get("/", headers="X-A: 1\r\nX-B: 2\r\nX-C: 3\r\n"), 431, "too many header fields: the limit is 3"),
        (
            get("/", headers=f"X-A: {'v' * 300}\r\n"),
            431,
            "request header fields too large: the limit is 256 bytes",
        ),
    ],
)
def test_a_request_over_a_size_limit_is_refused_before_any_handler(
    request_bytes: bytes, status: int, message: str
) -> None:
    async def scenario(running: RunningServer, handler: RecordingHandler) -> None:
        assert await _refusal(running, request_bytes) == (status, message, True)

    limits = HttpLimits(max_url_size=100, max_header_count=3, max_header_size=256)
    assert run_with_server(scenario, limits=limits).requests == []


def test_headers_that_do_not_arrive_in_time_get_408() -> None:
    async def scenario(running: RunningServer, handler: RecordingHandler) -> None:
        expected = (408, f"request headers not received within {SHORT:g}s", True)
        assert await _refusal(running, b"GET /slow HTTP/1.1\r\nHost: te") == expected

    assert run_with_server(scenario, limits=HttpLimits(header_timeout=SHORT)).requests == []


def test_a_body_that_stops_arriving_gets_408() -> None:
    async def scenario(running: RunningServer, handler: RecordingHandler) -> None:
        half_sent = b"POST /half HTTP/1.1\r\nHost: test\r\nContent-Length: 10\r\n\r\n01234"
        expected = (408, f"request body: nothing received for {SHORT:g}s", True)
        assert await _refusal(running, half_sent) == expected

    assert run_with_server(scenario, limits=HttpLimits(body_timeout=SHORT)).requests == []


def test_an_idle_keep_alive_connection_is_closed_without_an_answer() -> None:
    async def scenario(running: RunningServer, handler: RecordingHandler) -> None:
        reader, writer = await running.connect()
        writer.write(get("/once"))
        assert (await read_response(reader)).status == 200
        assert await reader.read() == b""  # closed once idle for the keep-alive timeout
        writer.close()
        await writer.wait_closed()

    run_with_server(scenario, limits=HttpLimits(keepalive_timeout=SHORT))


def test_a_slow_handler_is_not_cut_short_by_the_connection_timeouts() -> None:
    async def scenario(running: RunningServer, handler: RecordingHandler) -> None:
        handler.holds["/slow"] = release = asyncio.Event()
        reader, writer = await running.connect()
        writer.write(get("/slow"))
        await asyncio.sleep(SHORT * 3)  # every timeout of the connection has run out meanwhile
        release.set()
        assert (await read_response(reader)).body == b"GET /slow "
        writer.close()
        await writer.wait_closed()

    limits = HttpLimits(header_timeout=SHORT, body_timeout=SHORT, keepalive_timeout=SHORT)
    run_with_server(scenario, limits=limits)


def test_connections_over_the_limit_get_503_and_service_resumes() -> None:
    async def scenario(running: RunningServer, handler: RecordingHandler) -> None:
        reader, writer = await running.connect()
        writer.write(get("/first"))
        assert (await read_response(reader)).status == 200
        assert await _refusal(running, get("/second")) == (503, "too many connections: the limit is 1", True)
        writer.close()
        await writer.wait_closed()
        while running.server.connections:  # the server sees the first one go
            await asyncio.sleep(0.01)
        reader, writer = await running.connect()
        writer.write(get("/third"))
        assert (await read_response(reader)).status == 200
        writer.close()
        await writer.wait_closed()

    handler = run_with_server(scenario, limits=HttpLimits(max_connections=1))
    assert [request.path for request in handler.requests] == ["/first", "/third"]
