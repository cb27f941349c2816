"""The line between the supervisor and a worker (`coreserve.server.workers._channel`), over a
real Unix socket pair: asks and answers in any order, bytes, errors that keep their status code,
a side that does not answer in time, and a side that goes away."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from coreserve.errors import InvalidArgumentError, UnavailableError
from coreserve.repository.memory import ModelMemoryBudgetError
from coreserve.server.workers._channel import Channel, ChannelClosed, error_data, error_from


async def _pair(handle: Any) -> tuple[Channel, Channel]:
    one, two = socket.socketpair()
    reader, writer = await asyncio.open_unix_connection(sock=one)
    asker = Channel(reader, writer, handle)
    reader, writer = await asyncio.open_unix_connection(sock=two)
    answerer = Channel(reader, writer, handle)
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
