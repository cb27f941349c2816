"""The HTTP/1.1 server (coreserve.server.httpd) in-process: framing, keep-alive and pipelining.

A trivial handler echoes each request (tests/core/server/httpd/http_server_doubles.py); a raw asyncio
client on the test's loop sends exact bytes and reads exact answers.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import weakref
import zlib

import orjson
import pytest

from .http_server_doubles import (
    RecordingHandler,
    RunningServer,
    get,
    post,
    read_response,
    run_with_server,
)


async def _closed_by_server(reader: asyncio.StreamReader) -> bool:
    """True when the server closed the connection: nothing more comes."""
    return await reader.read() == b""


async def _done(writer: asyncio.StreamWriter) -> None:
    writer.close()
    await writer.wait_closed()


def test_pipelined_requests_are_handled_one_at_a_time_and_answered_in_order() -> None:
    async def scenario(running: RunningServer, handler: RecordingHandler) -> None:
        handler.holds["/slow"] = release = asyncio.Event()
        reader, writer = await running.connect()
        writer.write(get("/slow") + post("/b", b"two") + get("/c"))  # one write, three requests
        while not handler.events:
            await asyncio.sleep(0)
        await asyncio.sleep(0.01)  # the loop may run anything: the later requests still wait
        assert handler.events == ["begin /slow"]
        release.set()
        answers = [await read_response(reader) for _ in range(3)]
        assert [answer.body for answer in answers] == [b"GET /slow ", b"POST /b two", b"GET /c "]
        assert all(answer.status == 200 and "connection" not in answer.headers for answer in answers)
        await _done(writer)

    handler = run_with_server(scenario)
    assert handler.events == ["begin /slow", "end /slow", "begin /b", "end /b", "begin /c", "end /c"]


def test_a_keep_alive_connection_serves_request_after_request() -> None:
    async def scenario(running: RunningServer, handler: RecordingHandler) -> None:
        reader, writer = await running.connect()
        for index in range(5):
            writer.write(post(f"/r{index}", str(index).encode()))
            answer = await read_response(reader)
            assert (answer.status, answer.body) == (200, f"POST /r{index} {index}".encode())
        assert len(running.server.connections) == 1
        await _done(writer)

    run_with_server(scenario)


@pytest.mark.parametrize(
    "request_bytes",
    [
        get("/last", headers="Connection: close\r\n"),
        b"GET /last HTTP/1.0\r\n\r\n",  # HTTP/1.0 closes unless asked to keep alive
    ],
)
def test_a_request_that_asks_to_close_gets_its_answer_then_the_connection_closes(
    request_bytes: bytes,
) -> None:
    async def scenario(running: RunningServer, handler: RecordingHandler) -> None:
        reader, writer = await running.connect()
        writer.write(request_bytes + get("/never"))
        answer = await read_response(reader)
        assert (answer.status, answer.body, answer.headers["connection"]) == (200, b"GET /last ", "close")
        assert await _closed_by_server(reader)
        await _done(writer)

    handler = run_with_server(scenario)
    assert [request.path for request in handler.requests] == ["/last"]


def test_a_body_arriving_byte_by_byte_is_one_body() -> None:
    async def scenario(running: RunningServer, handler: RecordingHandler) -> None:
        reader, writer = await running.connect()
        for byte in post("/drip", b"0123456789"):
            writer.write(bytes([byte]))
            await writer.drain()
        assert (await read_response(reader)).body == b"POST /drip 0123456789"
        await _done(writer)

    handler = run_with_server(scenario)
    assert [request.body for request in handler.requests] == [b"0123456789"]


def test_a_chunked_request_body_is_joined_and_trailers_are_read_past() -> None:
    chunked = (
        b"POST /chunked HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n1;ext=1\r\n \r\n5\r\nworld\r\n0\r\nX-Trailer: yes\r\n\r\n"
    )

    async def scenario(running: RunningServer, handler: RecordingHandler) -> None:
        reader, writer = await running.connect()
        half = len(chunked) // 2
        writer.write(chunked[:half])  # split mid-chunk
        await writer.drain()
        writer.write(chunked[half:] + get("/after"))
        assert (await read_response(reader)).body == b"POST /chunked hello world"
        assert (await read_response(reader)).body == b"GET /after "
        await _done(writer)

    handler = run_with_server(scenario)
    assert handler.requests[0].headers["transfer-encoding"] == "chunked"


def test_expect_100_continue_is_answered_before_the_body_is_sent() -> None:
    async def scenario(running: RunningServer, handler: RecordingHandler) -> None:
        reader, writer = await running.connect()
        writer.write(b"POST /big HTTP/1.1\r\nHost: test\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
        assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        assert handler.requests == []
        writer.write(b"body")
        assert (await read_response(reader)).body == b"POST /big body"
        await _done(writer)

    run_with_server(scenario)


def test_a_body_over_the_limit_is_refused_with_413_before_it_is_sent() -> None:
    async def scenario(running: RunningServer, handler: RecordingHandler) -> None:
        reader, writer = await running.connect()
        writer.write(
            b"POST /big HTTP/1.1\r\nHost: test\r\nContent-Length: 11\r\nExpect: 100-continue\r\n\r\n"
        )
        answer = await read_response(reader)
        assert answer.status == 413 and answer.headers["connection"] == "close"
        assert orjson.loads(answer.body) == {"error": "request body too large: the limit is 10 bytes"}
        await _done(writer)

    handler = run_with_server(scenario, max_body_size=10)
    assert handler.requests == []


def test_a_chunked_body_that_grows_over_the_limit_is_refused_with_413() -> None:
    async def scenario(running: RunningServer, handler: RecordingHandler) -> None:
        reader, writer = await running.connect()
        writer.write(
            b"POST /big HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"6\r\nabcdef\r\n6\r\nghijkl\r\n0\r\n\r\n"
        )
        answer = await read_response(reader)
        assert answer.status == 413
        assert await _closed_by_server(reader)
        await _done(writer)

    handler = run_with_server(scenario, max_body_size=10)
    assert handler.requests == []


def test_a_streamed_answer_is_sent_as_one_chunk_per_piece() -> None:
    async def scenario(running: RunningServer, handler: RecordingHandler) -> None:
        handler.streams["/events"] = [b"data: 1\n\n", b"", b"data: 22\n\n"]
        reader, writer = await running.connect()
        writer.write(get("/events") + get("/next"))
        answer = await read_response(reader)
        assert answer.headers["transfer-encoding"] == "chunked" and answer.headers["x-path"] == "/events"
        assert answer.chunk_sizes == [9, 10]  # an empty piece sends nothing (it would end the body)
        assert answer.body == b"data: 1\n\ndata: 22\n\n"
        assert (await read_response(reader)).body == b"GET /next "  # the connection goes on
        await _done(writer)

    run_with_server(scenario)


@pytest.mark.parametrize(
    ("accept", "coding"),
    [
        ("gzip", "gzip"),
        ("br, deflate", "deflate"),
        ("identity", None),
        ("br", None),
        ("gzip;q=0", None),
        ("gzip;q=0, deflate;q=0.5", "deflate"),
    ],
)
def test_an_answer_is_compressed_only_as_the_request_accepts(accept: str, coding: str | None) -> None:
    async def scenario(running: RunningServer, handler: RecordingHandler) -> None:
        reader, writer = await running.connect()
        writer.write(post("/zip", b"x" * 1000, headers=f"Accept-Encoding: {accept}\r\n"))
        answer = await read_response(reader)
        assert answer.headers.get("content-encoding") == coding
        body = zlib.decompress(answer.body, wbits=47) if coding else answer.body  # 47: either header
        assert body == b"POST /zip " + b"x" * 1000
        if coding:
            assert len(answer.body) < 100
        await _done(writer)

    run_with_server(scenario)


def test_a_failing_handler_gets_500_logged_once_and_the_connection_closes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario(running: RunningServer, handler: RecordingHandler) -> None:
        handler.failing.add("/broken")
        reader, writer = await running.connect()
        writer.write(get("/broken") + get("/never"))
        answer = await read_response(reader)
        assert (answer.status, orjson.loads(answer.body)) == (500, {"error": "internal server error"})
        assert await _closed_by_server(reader)
        await _done(writer)
        reader, writer = await running.connect()  # the server goes on serving
        writer.write(get("/fine"))
        assert (await read_response(reader)).status == 200
        await _done(writer)

    with caplog.at_level(logging.ERROR, logger="coreserve.server.httpd._answering"):
        handler = run_with_server(scenario)
    assert [record.getMessage() for record in caplog.records] == ["HTTP request failed"]
    assert [request.path for request in handler.requests] == ["/broken", "/fine"]


@pytest.mark.parametrize(
    "garbage",
    [
        b"NOT HTTP AT ALL\r\n\r\n",
        b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n",
        b"GET / HTTP/1.1\r\nBad Header\r\n\r\n",
    ],
)
def test_a_malformed_request_gets_400_and_reaches_no_handler(garbage: bytes) -> None:
    async def scenario(running: RunningServer, handler: RecordingHandler) -> None:
        reader, writer = await running.connect()
        writer.write(get("/first") + garbage)
        assert (await read_response(reader)).status == 200  # what came before is answered
        answer = await read_response(reader)
        assert answer.status == 400 and answer.headers["connection"] == "close"
        assert orjson.loads(answer.body)["error"].startswith("malformed HTTP request: ")
        await _done(writer)

    handler = run_with_server(scenario)
    assert [request.path for request in handler.requests] == ["/first"]


def test_a_client_that_leaves_mid_request_is_reported_to_the_handler() -> None:
    async def scenario(running: RunningServer, handler: RecordingHandler) -> None:
        handler.holds["/long"] = release = asyncio.Event()
        _, writer = await running.connect()
        writer.write(get("/long"))
        while not handler.requests:
            await asyncio.sleep(0)
        left = asyncio.Event()
        handler.requests[0].on_disconnect = left.set
        await _done(writer)
        await left.wait()
        assert handler.requests[0].disconnected
        release.set()

    run_with_server(scenario)


def test_a_closed_connection_is_freed_at_once_not_by_the_garbage_collector() -> None:
    # A connection object holds what it read of its last request (up to a whole body); held in a
    # reference cycle, it stayed until the collector's next full pass.
    async def scenario(running: RunningServer, handler: RecordingHandler) -> None:
        reader, writer = await running.connect()
        writer.write(post("/large", b"x" * 300_000))  # read in several pieces
        assert (await read_response(reader)).status == 200
        gone = weakref.ref(next(iter(running.server.connections)))
        handler.requests.clear()
        await _done(writer)
        while running.server.connections:  # until the server saw the connection go
            await asyncio.sleep(0.01)
        assert gone() is None

    gc.disable()
    try:
        run_with_server(scenario)
    finally:
        gc.enable()


def test_stopping_lets_the_running_request_finish_and_closes_idle_connections() -> None:
    async def scenario(running: RunningServer, handler: RecordingHandler) -> None:
        handler.holds["/running"] = release = asyncio.Event()
        idle_reader, idle_writer = await running.connect()
        idle_writer.write(get("/idle"))
        await read_response(idle_reader)
        reader, writer = await running.connect()
        writer.write(get("/running"))
        while len(handler.requests) < 2:
            await asyncio.sleep(0)
        stopping = asyncio.create_task(running.server.stop(timeout=30))
        assert await _closed_by_server(idle_reader)  # idle: closed at once
        assert not stopping.done()
        release.set()
        answer = await read_response(reader)
        assert (answer.status, answer.body) == (200, b"GET /running ")
        await stopping
        await _done(idle_writer)
        await _done(writer)

    run_with_server(scenario)
