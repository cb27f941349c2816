"""Worker 0's side of a line another worker sends it requests on (`coreserve.server.workers._owner`),
over a real Unix socket pair, in front of a real data plane (an in-process server with a real
ONNX model): a request it cannot run gets an error for that request; a frame it must not take
(too large, unreadable, without its fields) closes that line alone, counted, with no traceback.

The line's peer check (only a sibling process connects) is tested with real workers in
tests/e2e/workers/test_trust.py."""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from collections.abc import Iterator

import numpy as np
import pytest

from coreserve.server.workers._line_frames import MAX_HEADER_BYTES, frame, read_frame
from coreserve.server.workers._owner import _Line
from coreserve.server.workers._trust import LINE_ERRORS, MALFORMED, OVERSIZED, LineErrors
from coreserve.testing import InProcessServer
from support.model_builders import ADD_SUB_CONFIG, add_sub_model, write_model

ADD = {"INPUT0": np.ones((1, 4), np.float32), "INPUT1": np.ones((1, 4), np.float32)}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    root = tmp_path_factory.mktemp("owner-line")
    write_model(root, "add_sub", add_sub_model(), ADD_SUB_CONFIG)
    server = InProcessServer(root).start()
    server.load("add_sub")
    yield server
    server.stop()


def _request(
    number: int, model: str, interface: str, tensors: dict[str, np.ndarray]
) -> list[bytes | memoryview]:
    header = {"n": number, "model": model, "version": 1, "interface": interface, "id": "",
              "parameters": {}, "outputs": None, "batch": 1}  # fmt: skip
    return frame(header, tensors)


class _Peer:
    """The other worker's end of a line that worker 0 serves (`_Line.serve`)."""

    def __init__(self, server: InProcessServer) -> None:
        self.server = server

    async def open(self) -> None:
        assert self.server.dataplane is not None
        one, two = socket.socketpair()
        self.reader, self.writer = await asyncio.open_unix_connection(sock=one)
        served_reader, served_writer = await asyncio.open_unix_connection(sock=two)
        self.line = _Line(self.server.dataplane, served_writer)
        self.serving = asyncio.create_task(self.line.serve(served_reader))
        self.serving.add_done_callback(lambda _: self.line.close())

    async def answers(self, count: int) -> dict[int, dict[str, object]]:
        received = {}
        while len(received) < count:
            answer = await asyncio.wait_for(read_frame(self.reader), 30)
            assert answer is not None
            received[answer.header["n"]] = answer.header
        return received

    async def closed(self) -> bool:
        """Whether worker 0 ended the line (then both ends are closed)."""
        await asyncio.wait_for(self.serving, 30)
        ended = await asyncio.wait_for(self.reader.read(), 30) == b""
        self.writer.close()
        await self.writer.wait_closed()
        return ended


def test_a_request_it_cannot_run_gets_its_error_and_the_line_serves_on(server: InProcessServer) -> None:
    async def run() -> None:
        peer = _Peer(server)
        await peer.open()
        digest = server.dataplane.model_version("add_sub", "1").interface_digest  # type: ignore[union-attr]
        peer.writer.writelines(_request(1, "nowhere", digest, {}))
        peer.writer.writelines(_request(2, "add_sub", "0" * 16, ADD))  # checked against other inputs
        peer.writer.writelines(_request(3, "add_sub", digest, ADD))
        answers = await peer.answers(3)
        assert answers[1]["error"]["kind"] == "NotFoundError" and "nowhere" in answers[1]["error"]["message"]
        assert answers[2]["error"]["kind"] == "UnavailableError"
        assert "other inputs, outputs, batch size" in answers[2]["error"]["message"]
        assert answers[3]["final"] is True and "error" not in answers[3]
        peer.writer.write_eof()
        assert await peer.closed()

    server.run(run())


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (frame({"n": 1, "model": "add_sub"}), MALFORMED),  # no version, interface, inputs ...
        (frame({"cancel": True, "n": "one"}), MALFORMED),
        ([struct.pack("!IQ", 5, 0), b"{nope"], MALFORMED),  # a header that is no JSON
        ([struct.pack("!IQ", 2, 0), b"[]"], MALFORMED),  # JSON, but no object
        ([struct.pack("!IQ", MAX_HEADER_BYTES + 1, 0)], OVERSIZED),  # refused before it is read
        ([struct.pack("!IQ", 2, 2**40), b"{}"], OVERSIZED),
    ],
    ids=["fields", "number", "json", "object", "header", "payload"],
)
def test_a_frame_it_must_not_take_closes_that_line_alone_and_is_counted(
    server: InProcessServer, bad: list[bytes], reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def run() -> None:
        kept, broken = _Peer(server), _Peer(server)
        await kept.open()
        await broken.open()
        before = LINE_ERRORS.counts[reason]
        broken.writer.writelines(bad)
        assert await broken.closed()
        assert LINE_ERRORS.counts[reason] == before + 1
        digest = server.dataplane.model_version("add_sub", "1").interface_digest  # type: ignore[union-attr]
        kept.writer.writelines(_request(7, "add_sub", digest, ADD))
        assert (await kept.answers(1))[7]["final"] is True
        kept.writer.write_eof()
        assert await kept.closed()

    with caplog.at_level(logging.WARNING):
        server.run(run())
    assert "worker 0 closed a worker's line" in caplog.text
    assert not [record for record in caplog.records if record.exc_info]  # no traceback


def test_the_count_of_closed_lines_is_a_counter_family_once_one_was_closed() -> None:
    errors = LineErrors()
    assert errors.render() == ""
    errors.count(MALFORMED)
    errors.count(MALFORMED)
    text = errors.render()
    assert "# TYPE coreserve_worker_line_errors_total counter" in text
    assert 'coreserve_worker_line_errors_total{reason="malformed"} 2\n' in text
