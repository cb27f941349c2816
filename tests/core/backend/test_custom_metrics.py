"""Custom metric families (coreserve.backend.CustomMetrics), in process."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from coreserve.backend import CustomMetrics, MetricKind
from coreserve.errors import InvalidArgumentError


def test_families_render_in_prometheus_text_and_leave_with_their_last_owner() -> None:
    metrics = CustomMetrics()
    counter = metrics.family("jobs_total", "Jobs done", MetricKind.COUNTER)
    again = metrics.family("jobs_total", "another text", MetricKind.COUNTER)
    assert again is counter and counter.description == "Jobs done"
    done = counter.metric({"queue": 'a"b\nc', "app": "x"})
    done.increment(2)
    done.increment(0.5)
    assert counter.metric({"app": "x", "queue": 'a"b\nc'}) is done  # labels in any order
    histogram = metrics.family("wait_seconds", "Waits", MetricKind.HISTOGRAM).metric({}, buckets=[1, 5])
    for value in (0.5, 1, 7):
        histogram.observe(value)
    assert metrics.render() == (
        "# HELP jobs_total Jobs done\n"
        "# TYPE jobs_total counter\n"
        'jobs_total{app="x",queue="a\\"b\\nc"} 2.5\n'
        "# HELP wait_seconds Waits\n"
        "# TYPE wait_seconds histogram\n"
        "wait_seconds_count 3\n"
        "wait_seconds_sum 8.5\n"
        'wait_seconds_bucket{le="1"} 2\n'
        'wait_seconds_bucket{le="5"} 2\n'
        'wait_seconds_bucket{le="+Inf"} 3\n'
    )
    counter.release_metric(done)
    assert "jobs_total{" in metrics.render()  # a second owner still holds it
    counter.release_metric(done)
    assert "jobs_total" not in metrics.render()  # no samples: the family is left out
    metrics.release(counter)
    metrics.release(counter)
    assert metrics.family("jobs_total", "d", MetricKind.GAUGE).kind is MetricKind.GAUGE  # gone: reusable


def test_what_is_given_back_with_keep_stays_with_its_values_for_the_next_owner() -> None:
    """(A Python model's stub that ended: Triton keeps its families, and a reload continues them.)"""
    metrics = CustomMetrics()
    family = metrics.family("calls_total", "Calls", MetricKind.COUNTER)
    calls = family.metric({"model": "m"})
    calls.increment(3)
    family.release_metric(calls, keep=True)
    metrics.release(family, keep=True)
    assert 'calls_total{model="m"} 3\n' in metrics.render()
    again = metrics.family("calls_total", "Calls", MetricKind.COUNTER)
    assert again is family and again.metric({"model": "m"}) is calls
    calls.increment(1)
    assert 'calls_total{model="m"} 4\n' in metrics.render()
    family.release_metric(calls)  # the next owner lets go for good: they leave
    metrics.release(family)
    assert metrics.render() == ""
    assert metrics.family("calls_total", "d", MetricKind.GAUGE).kind is MetricKind.GAUGE


def test_mistakes_are_refused_in_tritons_words() -> None:
    metrics = CustomMetrics()
    gauge = metrics.family("level", "d", MetricKind.GAUGE)
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: metrics.family("bad name", "d", MetricKind.GAUGE), "Invalid metric name"),
        (
            lambda: metrics.family("nv_inference_count", "d", MetricKind.COUNTER),
            "metric family name 'nv_inference_count' is reserved: names starting with nv_ or coreserve_ "
            "are the server's own families",
        ),
        (lambda: metrics.family("level", "d", MetricKind.COUNTER), "Family name already exists with different type"),
        (lambda: gauge.metric({"a": 1}), "attempt to access JSON non-string as string"),  # type: ignore[dict-item]
        (lambda: gauge.metric({"__x": "1"}), "Invalid label name '__x'"),
        (lambda: gauge.metric({}).observe(1), "TRITONSERVER_METRIC_KIND_GAUGE does not support Observe"),
        (
            lambda: metrics.family("n", "d", MetricKind.COUNTER).metric({}).increment(-1),
            "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by non-negative values.",
        ),
        (
            lambda: metrics.family("h", "d", MetricKind.HISTOGRAM).metric({}, [2, 2]),
            "Bucket Boundaries must be strictly sorted",
        ),
        (lambda: metrics.family("h", "d", MetricKind.HISTOGRAM).metric({}, [1]).value(),
         "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value"),
    ]  # fmt: skip
    for attempt, message in cases:
        with pytest.raises(InvalidArgumentError) as error:
            attempt()
        assert error.value.message == message
