"""InferenceRequest's cancellation: the part of the public API that backends call."""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest

from coreserve import InferenceRequest


def _request() -> InferenceRequest:
    return InferenceRequest("model", {"INPUT0": np.zeros(1, np.float32)})


def test_cancel_runs_each_callback_once_in_order() -> None:
    request = _request()
    calls: list[str] = []
    request.on_cancel(lambda: calls.append("first"))
    forget = request.on_cancel(lambda: calls.append("forgotten"))
    request.on_cancel(lambda: calls.append("last"))
    forget()
    assert not request.is_cancelled()
    request.cancel()
    request.cancel()
    assert request.is_cancelled()
    assert calls == ["first", "last"]
    # Registered after the fact: runs at once.
    request.on_cancel(lambda: calls.append("late"))
    assert calls == ["first", "last", "late"]


def test_a_failing_callback_is_logged_and_the_others_still_run(caplog: pytest.LogCaptureFixture) -> None:
    request = _request()
    request.id = "r1"
    calls: list[str] = []

    def broken() -> None:
        raise RuntimeError("broken callback")

    request.on_cancel(broken)
    request.on_cancel(lambda: calls.append("after"))
    with caplog.at_level(logging.ERROR):
        request.cancel()
    assert calls == ["after"]
    assert "request 'r1'" in caplog.text and "broken callback" in caplog.text


def test_wait_cancelled_returns_once_the_request_is_cancelled() -> None:
    async def scenario() -> list[str]:
        request = _request()
        events: list[str] = []

        async def work() -> None:
            await asyncio.sleep(30)

        waiter = asyncio.create_task(request.wait_cancelled())
        worker = asyncio.create_task(work())
        asyncio.get_running_loop().call_later(0.01, request.cancel)
        done, _ = await asyncio.wait([waiter, worker], return_when=asyncio.FIRST_COMPLETED)
        events.append("cancelled" if waiter in done else "worked")
        worker.cancel()
        await request.wait_cancelled()  # already cancelled: returns at once
        events.append("again")
        return events

    assert asyncio.run(scenario()) == ["cancelled", "again"]
