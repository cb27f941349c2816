"""The sinks a frontend waits on: a queue of responses bounded by what waits in it."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from coreserve.errors import UnavailableError
from coreserve.responses import QueuedResponses
from coreserve.types import InferenceResponse


def _response(size: int) -> InferenceResponse:
    return InferenceResponse("m", "1", {"OUT": np.zeros(size, np.uint8)})


async def _taken(sink: QueuedResponses) -> list[int]:
    return [response.outputs["OUT"].size async for response in sink.responses()]


def test_what_was_taken_no_longer_counts_toward_the_bound() -> None:
    async def scenario() -> list[int]:
        sink = QueuedResponses(max_waiting_bytes=1000)
        sink.send(_response(600), final=False)
        sink.send(_response(300), final=False)  # 900 wait
        taken = [(await anext(sink.responses())).outputs["OUT"].size]  # 300 wait
        sink.send(_response(600), final=False)  # 900 wait: within the bound
        sink.send(None, final=True)
        return taken + await _taken(sink)

    assert asyncio.run(scenario()) == [600, 300, 600]


def test_without_a_bound_everything_waits_for_its_reader() -> None:
    """(An ensemble's decoupled step, the in-process API: readers inside the server.)"""
    sink = QueuedResponses()
    for _ in range(100):
        sink.send(_response(1 << 20), final=False)
    sink.send(None, final=True)
    assert asyncio.run(_taken(sink)) == [1 << 20] * 100


def test_past_the_bound_what_waits_is_dropped_and_the_request_ends_with_why() -> None:
    overflows: list[str] = []
    sink = QueuedResponses(max_waiting_bytes=1000, on_overflow=lambda: overflows.append("cancel"))
    sink.send(_response(2000), final=False)  # one response waits whatever its size
    sink.send(_response(100), final=False)  # a second one past the bound: the end
    sink.send(_response(100), final=True)  # (ignored: the request ended)
    assert sink.done and overflows == ["cancel"]
    with pytest.raises(UnavailableError, match=r"taken too slowly: 2 responses of 2100 bytes waited"):
        asyncio.run(_taken(sink))


def test_bytes_outputs_count_by_their_lengths() -> None:
    sink = QueuedResponses(max_waiting_bytes=1000)
    words = np.array([b"x" * 400, b"y" * 400], dtype=np.object_)
    sink.send(InferenceResponse("m", "1", {"OUT": words}), final=False)
    sink.send(InferenceResponse("m", "1", {"OUT": words}), final=False)  # 1600 bytes wait
    with pytest.raises(UnavailableError, match="1600 bytes waited"):
        asyncio.run(_taken(sink))


def test_the_final_response_always_waits() -> None:
    """It ends the stream (nothing more comes to hold), and the model has finished the request."""
    overflows: list[str] = []
    sink = QueuedResponses(max_waiting_bytes=1000, on_overflow=lambda: overflows.append("cancel"))
    sink.send(_response(800), final=False)
    sink.send(_response(800), final=True)
    assert asyncio.run(_taken(sink)) == [800, 800] and overflows == []


def test_flagged_tells_a_final_response_from_a_final_flag_sent_alone() -> None:
    """What a BLS stream tells apart, as Triton's: its last response, or an empty end after it."""

    async def taken(sink: QueuedResponses) -> list[tuple[int | None, bool]]:
        return [(None if r is None else r.outputs["OUT"].size, final) async for r, final in sink.flagged()]

    carried = QueuedResponses()
    carried.send(_response(1), final=False)
    carried.send(_response(2), final=True)
    alone = QueuedResponses()
    alone.send(_response(1), final=False)
    alone.send(None, final=True)
    assert asyncio.run(taken(carried)) == [(1, False), (2, True)]
    assert asyncio.run(taken(alone)) == [(1, False), (None, True)]


def test_flagged_raises_the_error_that_ends_the_request_after_what_came_before() -> None:
    sink = QueuedResponses()
    sink.send(_response(1), final=False)
    sink.fail(UnavailableError("the model went away"))
    sink.send(_response(2), final=True)  # (ignored: the request ended)
    seen: list[bool] = []

    async def read() -> None:
        async for _, final in sink.flagged():
            seen.append(final)

    with pytest.raises(UnavailableError, match="the model went away"):
        asyncio.run(read())
    assert seen == [False]
