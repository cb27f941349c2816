"""Waiting on what a test can observe, instead of sleeping until it has probably happened.

A test that sleeps a fixed time before it looks is flaky on a loaded machine (the thing has
not happened yet) and slow on an idle one (it happened long ago). `wait_until` polls the real
state (a statistic, a file a model wrote, a metric) until it holds, and fails with a message
naming what never happened when a generous bound runs out: the bound is there so that a test
ends, never to assert how quickly the server was.
"""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], what: str, timeout: float = 60.0, interval: float = 0.02) -> T:
    """Polls `condition` until it returns something true, and returns that.

    `what` names the condition in the failure message; `timeout` bounds the wait only so that
    a test that would otherwise hang fails.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(interval)


PENDING = "nv_inference_pending_request_count"  # Triton's: not yet begun by an instance
EXECUTING = "coreserve_inference_executing_request_count"  # ours: begun, not yet done


def model_gauges(metrics_url: str, model: str, *families: str, version: str = "1") -> list[int]:
    """The values of a model version's gauges `families`, read from one scrape."""
    with urllib.request.urlopen(metrics_url, timeout=30) as answer:
        text = answer.read().decode()
    labels = re.escape(f'{{model="{model}",version="{version}"}}')
    values = []
    for family in families:
        found = re.search(rf"^{family}{labels} (\d+)$", text, re.MULTILINE)
        assert found, f"no {family} for {model} {version}:\n{text}"
        values.append(int(found.group(1)))
    return values


def requests_in(metrics_url: str, model: str, version: str = "1") -> int:
    """A model's requests queued or executing, as the server reports them: what a test waits
    on before it acts on requests in flight."""
    return sum(model_gauges(metrics_url, model, PENDING, EXECUTING, version=version))
