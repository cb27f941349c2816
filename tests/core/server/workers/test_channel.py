"""The line between the supervisor and a worker (`coreserve.server.workers._channel`), over a
real Unix socket pair: asks and answers in any order, bytes, errors that keep their status code,
a side that does not answer in time, and a side that goes away."""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from typing import Any

import pytest

from coreserve.errors import InvalidArgumentError, UnavailableError
from coreserve.repository.memory.budgets import ModelMemoryBudgetError
from coreserve.server.workers._channel import Channel, ChannelClosed, error_data, error_from
from coreserve.server.workers._trust import LINE_ERRORS, MALFORMED, OVERSIZED

LIMIT = 1024 * 1024


async def _pair(handle: Any) -> tuple[Channel, Channel]:
    one, two = socket.socketpair()
    reader, writer = await asyncio.open_unix_connection(sock=one)
    asker = Channel(reader, writer, handle, LIMIT)
    reader, writer = await asyncio.open_unix_connection(sock=two)
    answerer = Channel(reader, writer, handle, LIMIT)
    return asker, answerer


def test_asks_are_answered_with_bytes_and_errors_as_they_were() -> None:
    async def handle(message: dict[str, Any]) -> Any:
        if message["call"] == "slow":
            await asyncio.sleep(0.2)
            return "slow"
        if message["call"] == "refuse":
            raise InvalidArgumentError("no such change: 'refuse'")
        if message["call"] == "budget":
            raise ModelMemoryBudgetError("the budget is full")
        return {"echo": message["data"], "nested": [message["data"]]}

    async def run() -> None:
        asker, answerer = await _pair(handle)
        slow = asyncio.create_task(asker.ask({"call": "slow"}))
        assert await asker.ask({"call": "echo", "data": b"\x00\xffraw"}) == {
            "echo": b"\x00\xffraw",
            "nested": [b"\x00\xffraw"],
        }  # answered before the slow one that was asked first
        assert await slow == "slow"
        with pytest.raises(InvalidArgumentError, match="no such change: 'refuse'"):
            await asker.ask({"call": "refuse"})
        with pytest.raises(UnavailableError, match="the budget is full") as refused:
            await asker.ask({"call": "budget"})  # a class of another module keeps its status code
        assert type(refused.value) is UnavailableError
        with pytest.raises(UnavailableError, match=r"did not answer 'slow' within 0\.05 s"):
            await asker.ask({"call": "slow"}, timeout=0.05)
        await answerer.close()
        await asyncio.wait_for(asker.closed.wait(), 5)
        with pytest.raises(ChannelClosed):
            await asker.ask({"call": "echo", "data": b""})
        await asker.close()

    asyncio.run(run())


def test_an_error_that_is_no_coreserve_error_travels_as_an_internal_one() -> None:
    travelled = error_from(error_data(KeyError("x")))
    assert travelled.code.value == "INTERNAL" and travelled.message == "KeyError: 'x'"
    assert type(error_from(error_data(ModelMemoryBudgetError("full")))) is UnavailableError


def _framed(body: bytes) -> bytes:
    return struct.pack("!I", len(body)) + body


@pytest.mark.parametrize(
    ("sent", "reason"),
    [
        (struct.pack("!I", LIMIT + 1), OVERSIZED),  # refused on its length, before a byte of it
        (_framed(b"{nope"), MALFORMED),
        (_framed(b"[1, 2]"), MALFORMED),
        (_framed(b'{"call": "change"}'), MALFORMED),  # neither an ask nor an answer
        (_framed(b'{"ask": 1, "call": "x", "data": {"__bytes__": 5}}'), MALFORMED),
    ],
    ids=["length", "json", "array", "no-number", "bytes"],
)
def test_a_message_past_the_limit_or_unreadable_closes_the_line_counted(
    sent: bytes, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    asked: list[dict[str, Any]] = []

    async def handle(message: dict[str, Any]) -> Any:
        asked.append(message)

    async def run() -> None:
        one, two = socket.socketpair()
        reader, writer = await asyncio.open_unix_connection(sock=one)
        channel = Channel(reader, writer, handle, LIMIT)
        other_reader, other_writer = await asyncio.open_unix_connection(sock=two)
        before = LINE_ERRORS.counts[reason]
        other_writer.write(sent)
        await asyncio.wait_for(channel.closed.wait(), 5)
        assert await asyncio.wait_for(other_reader.read(), 5) == b""  # the other side sees the end
        assert LINE_ERRORS.counts[reason] == before + 1
        other_writer.close()
        await channel.close()

    with caplog.at_level(logging.WARNING):
        asyncio.run(run())
    assert asked == [] and "worker line closed" in caplog.text
    assert not [record for record in caplog.records if record.exc_info]
