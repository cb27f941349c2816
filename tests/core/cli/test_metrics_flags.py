"""The metric flags: Triton's --metrics-config settings and defaults, and clear errors for bad values."""

from __future__ import annotations

import pytest

from coreserve.cli._flags import parse_serve_args
from coreserve.cli._options import server_options

BASE = ["--model-repository=/tmp/models"]


def test_defaults_are_tritons() -> None:
    options = server_options(parse_serve_args(BASE))
    assert (options.counter_latencies, options.summary_latencies, options.histogram_latencies) == (
        True,
        False,
        False,
    )
    assert options.summary_quantiles == (0.5, 0.9, 0.95, 0.99, 0.999)
    assert (options.allow_cpu_metrics, options.allow_gpu_metrics, options.metrics_interval_ms) == (
        True,
        True,
        2000.0,
    )


def test_settings_are_read_in_both_forms() -> None:
    args = parse_serve_args(
        [
            *BASE,
            "--metrics-config=summary_latencies=true",
            "--metrics-config",
            "counter_latencies=off",
            "--metrics-config=histogram_latencies=1",
            "--metrics-config",
            'summary_quantiles="0.99:0.001,0.5:0.05"',
            "--allow-cpu-metrics=false",
            "--allow-gpu-metrics",
            "false",
            "--metrics-interval-ms",
            "250.5",
        ]
    )
    options = server_options(args)
    assert (options.counter_latencies, options.summary_latencies, options.histogram_latencies) == (
        False,
        True,
        True,
    )
    assert options.summary_quantiles == (0.5, 0.99)
    assert (options.allow_cpu_metrics, options.allow_gpu_metrics, options.metrics_interval_ms) == (
        False,
        False,
        250.5,
    )


@pytest.mark.parametrize(
    ("argument", "message"),
    [
        ("--metrics-config=latency_buckets=1", "a setting among counter_latencies, summary_latencies"),
        ("--metrics-config=summary_latencies", "got 'summary_latencies'"),
        ("--metrics-config=summary_latencies=maybe", "summary_latencies: invalid value for bool option"),
        ("--metrics-config=summary_quantiles=abc", "got 'abc'"),
        ("--metrics-config=summary_quantiles=0.5:0.05,1.5:0.01", "got '1.5:0.01'"),
        ("--metrics-config=summary_quantiles=0.5", "got '0.5'"),
        ("--metrics-config=summary_quantiles=0.5:2", "got '0.5:2'"),
        ("--metrics-interval-ms=-5", "above 0, got '-5'"),
        ("--metrics-interval-ms=0", "above 0, got '0'"),
        ("--metrics-interval-ms=often", "expected a number of milliseconds, got 'often'"),
        ("--allow-cpu-metrics=perhaps", "invalid value for bool option"),
        ("--model-namespacing=yes", "invalid value for bool option"),
    ],
)
def test_bad_values_are_refused_with_the_reason(
    argument: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_serve_args([*BASE, argument])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert message in error
    assert "Traceback" not in error
