"""Tracing in process: the settings' rules, sampling by rate and count, --trace-config parsing."""

from __future__ import annotations

import numpy as np
import pytest

from coreserve.errors import InvalidArgumentError, UnsupportedError
from coreserve.tracing import TraceConfig, Tracer, TraceSetting, TraceSettings
from coreserve.tracing.config import parse_trace_config
from coreserve.types import InferenceRequest

FILE = "trace.json"  # (named only: Tracer.start, which opens it, is not called)


def _request(model: str = "m", request_id: str = "") -> InferenceRequest:
    return InferenceRequest(model, {"X": np.zeros((1, 2), np.float32)}, id=request_id)


def test_tracing_off_by_default_leaves_the_request_path_one_check() -> None:
    tracer = Tracer()
    assert tracer.active is False
    assert tracer.setting() == TraceSetting()


def test_model_fields_override_and_follow_the_global_setting() -> None:
    settings = TraceSettings(TraceSetting(trace_level=("TIMESTAMPS",), trace_rate=1, trace_file=FILE))
    assert settings.update({"trace_rate": "5"}, "m").trace_rate == 5
    settings.update({"trace_count": "10", "trace_rate": "7"})
    assert (settings.setting("m").trace_rate, settings.setting("m").trace_count) == (5, 10)
    assert settings.update({"trace_rate": None}, "m").trace_rate == 7
    assert not settings.has_own("m")
    assert settings.update({"trace_rate": None}).trace_rate == 1  # back to the start-up value


def test_a_bad_change_changes_nothing() -> None:
    settings = TraceSettings(TraceSetting(trace_rate=3))
    with pytest.raises(InvalidArgumentError, match="Expecting value >= -1"):
        settings.update({"trace_rate": "9", "trace_count": "-2"})
    with pytest.raises(UnsupportedError):
        settings.update({"trace_file": "x"})
    assert settings.setting().trace_rate == 3


def test_rate_samples_every_nth_request_while_the_count_lasts() -> None:
    tracer = Tracer(TraceConfig(TraceSetting(trace_level=("TIMESTAMPS",), trace_rate=2, trace_count=2)))
    traced = [tracer.trace(_request(request_id=str(n)), 1) for n in range(8)]
    assert [t.request_id for t in traced if t is not None] == ["1", "3"]
    assert tracer.setting().trace_count == 0


def test_a_model_with_its_own_count_spends_its_own() -> None:
    tracer = Tracer(TraceConfig(TraceSetting(("TIMESTAMPS",), trace_rate=1, trace_count=5, trace_file=FILE)))
    tracer.update({"trace_count": "1"}, "m")
    assert tracer.trace(_request("m"), 1) is not None
    assert tracer.trace(_request("m"), 1) is None
    assert tracer.trace(_request("other"), 1) is not None
    assert (tracer.setting("m").trace_count, tracer.setting().trace_count) == (0, 4)


def test_a_child_request_is_traced_with_its_parent() -> None:
    tracer = Tracer(TraceConfig(TraceSetting(trace_level=("TENSORS",), trace_rate=1, trace_file=FILE)))
    parent = _request("ensemble")
    parent.trace = tracer.trace(parent, 1)
    tracer.update({"trace_level": ["OFF"]})  # children still follow a traced parent
    child = _request("step")
    child.trace_as_child_of(parent)
    trace = tracer.trace(child, 1)
    assert trace is not None and trace.parent is parent.trace
    assert [t.activity for t in trace.tensor_records] == ["TENSOR_QUEUE_INPUT"]
    # The child of an untraced request (or of none: a BLS call without the request's trace) is
    # not traced, whatever the rate: as Triton, it is not sampled on its own.
    tracer.update({"trace_level": ["TIMESTAMPS"]})
    for untraced_parent in (_request("ensemble"), None):
        untraced = _request("step")
        untraced.trace_as_child_of(untraced_parent)
        assert untraced.trace_context is not None and not untraced.trace_context.sampled
        assert tracer.trace(untraced, 1) is None
    assert tracer.trace(_request("step"), 1) is not None  # a client's request is sampled at rate 1


def test_changes_that_could_not_trace_are_refused_in_tritons_words() -> None:
    """Checked against Triton 2.51: the setting a change makes is checked, not the change alone."""
    without_file = TraceSettings(TraceSetting())
    with pytest.raises(
        InvalidArgumentError, match=r"^Attempting to set invalid trace setting :trace file name is not given$"
    ):
        without_file.update({"trace_level": ["TIMESTAMPS"]}, "m")
    with_file = TraceSettings(TraceSetting(trace_file=FILE))
    assert with_file.update({"trace_rate": "0"}).trace_rate == 0  # kept while the level is OFF
    with pytest.raises(InvalidArgumentError, match="sample rate must be non-zero"):
        with_file.update({"trace_level": ["TIMESTAMPS"]})
    assert with_file.setting().trace_level == ("OFF",)
    opentelemetry = TraceSettings(
        TraceSetting(trace_level=("TIMESTAMPS",), trace_rate=0, trace_mode="opentelemetry")
    )
    assert opentelemetry.update({"trace_count": "5"}).trace_count == 5  # rate 0 from the start-up
    with pytest.raises(InvalidArgumentError, match="sample rate must be non-zero"):
        opentelemetry.update({"trace_rate": "0"})


def test_trace_config_reads_tritons_forms_and_the_older_flags() -> None:
    config = parse_trace_config(
        [
            "level=TIMESTAMPS",
            "level=TENSORS",
            "rate=10",
            "triton,log-frequency=5",
            "opentelemetry,resource=a=b",
        ],
        trace_file="/tmp/t.json",
        rate=3,
        count=7,
    )
    assert config.setting == TraceSetting(
        trace_level=("TIMESTAMPS", "TENSORS"),
        trace_rate=10,
        trace_count=7,
        log_frequency=5,
        trace_file="/tmp/t.json",
    )
    assert config.opentelemetry.resource == {"service.name": "triton-inference-server", "a": "b"}
    with pytest.raises(InvalidArgumentError, match="unknown setting 'url'"):
        parse_trace_config(["triton,url=x"])


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("count=2147483648", "the trace count must be within -1..2147483647, got 2147483648"),
        ("rate=4294967296", "the trace rate must be within 0..4294967295, got 4294967296"),
        ("log-frequency=4294967296", "the trace log frequency must be within 0..4294967295, got 4294967296"),
    ],
)
def test_trace_config_numbers_stay_within_tritons_types(entry: str, message: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        parse_trace_config([entry])
    assert info.value.message == message
