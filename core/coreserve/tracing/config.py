"""`--trace-config` as tritonserver reads it, and the older --trace-* flags.

Forms: `SETTING=VALUE` for the global settings (`level`, `rate`, `count`, `mode`, and, as
coreserve also takes them without the mode, `file` and `log-frequency`), `triton,SETTING=VALUE`
(`file`, `log-frequency`) and `opentelemetry,SETTING=VALUE` (`url`, `resource=KEY=VALUE`,
`bsp_max_queue_size`, `bsp_schedule_delay`, `bsp_max_export_batch_size`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from coreserve.errors import InvalidArgumentError
from coreserve.tracing._settings import (
    LEVELS,
    MODES,
    OpenTelemetryOptions,
    TraceConfig,
    TraceSetting,
    check_setting,
)

_GLOBAL = {"level", "rate", "count", "mode", "file", "log-frequency", "log_frequency"}
_TRITON = {"file", "log-frequency", "log_frequency"}
_OTEL_NUMBERS = ("bsp_max_queue_size", "bsp_schedule_delay", "bsp_max_export_batch_size")


def parse_trace_config(
    entries: Sequence[str],
    *,
    trace_file: str | None = None,
    levels: Sequence[str] = (),
    rate: int | None = None,
    count: int | None = None,
    log_frequency: int | None = None,
) -> TraceConfig:
    """The trace configuration of the command line; raises InvalidArgumentError naming the mistake.

    The older flags (--trace-file, --trace-level, --trace-rate, --trace-count,
    --trace-log-frequency) are read first; --trace-config entries override them, as in Triton.
    """
    setting: dict[str, Any] = {}
    if trace_file is not None:
        setting["trace_file"] = trace_file
    if levels:
        setting["trace_level"] = _levels(levels)
    for name, given in (("trace_rate", rate), ("trace_count", count), ("log_frequency", log_frequency)):
        if given is not None:
            setting[name] = given
    otel: dict[str, Any] = {}
    resource: dict[str, str] = {}
    config_levels: list[str] = []
    for entry in entries:
        mode, sep, rest = entry.partition(",")
        if not sep:
            mode, rest = "", entry
        key, equals, value = rest.partition("=")
        key = key.strip()
        if not equals:
            raise InvalidArgumentError(f"--trace-config '{entry}': expected [MODE,]SETTING=VALUE")
        if mode not in ("", *MODES):
            raise InvalidArgumentError(
                f"--trace-config '{entry}': unknown mode '{mode}'; expected triton or opentelemetry"
            )
        if mode == "opentelemetry":
            if key == "url":
                otel["url"] = value
            elif key == "resource":
                name, eq, attribute = value.partition("=")
                if not eq or not name:
                    raise InvalidArgumentError(f"--trace-config '{entry}': expected resource=KEY=VALUE")
                resource[name] = attribute
            elif key in _OTEL_NUMBERS:
                otel[key] = _number(entry, value, minimum=1)
            else:
                raise InvalidArgumentError(
                    f"--trace-config '{entry}': unknown opentelemetry setting '{key}'; known: url, resource, "
                    + ", ".join(_OTEL_NUMBERS)
                )
            continue
        if key not in (_TRITON if mode == "triton" else _GLOBAL):
            known = ", ".join(sorted(_TRITON if mode == "triton" else _GLOBAL - {"log_frequency"}))
            raise InvalidArgumentError(f"--trace-config '{entry}': unknown setting '{key}'; known: {known}")
        if key == "level":
            config_levels.append(value)
        elif key == "rate":
            setting["trace_rate"] = _number(entry, value, minimum=0)
        elif key == "count":
            setting["trace_count"] = _number(entry, value, minimum=-1)
        elif key == "mode":
            if value not in MODES:
                raise InvalidArgumentError(
                    f"--trace-config '{entry}': unknown mode; expected triton or opentelemetry"
                )
            setting["trace_mode"] = value
        elif key == "file":
            setting["trace_file"] = value
        else:
            setting["log_frequency"] = _number(entry, value, minimum=0)
    if config_levels:
        setting["trace_level"] = _levels(config_levels)
    trace_setting = replace(TraceSetting(), **setting)
    check_setting(trace_setting)
    options = OpenTelemetryOptions(**otel)
    if resource:
        options = replace(options, resource={**options.resource, **resource})
    if options.bsp_max_export_batch_size > options.bsp_max_queue_size:
        raise InvalidArgumentError(
            "--trace-config opentelemetry,bsp_max_export_batch_size must not exceed bsp_max_queue_size "
            f"({options.bsp_max_export_batch_size} > {options.bsp_max_queue_size})"
        )
    return TraceConfig(setting=trace_setting, opentelemetry=options)


def _levels(values: Sequence[str]) -> tuple[str, ...]:
    levels: list[str] = []
    for value in values:
        level = value.strip().upper()
        if level not in LEVELS:
            raise InvalidArgumentError(f"unknown trace level '{value}'; expected OFF, TIMESTAMPS or TENSORS")
        if level != "OFF" and level not in levels:
            levels.append(level)
    return tuple(levels) or ("OFF",)


def _number(entry: str, value: str, *, minimum: int) -> int:
    try:
        number = int(value)
    except ValueError:
        raise InvalidArgumentError(f"--trace-config '{entry}': '{value}' is not a whole number") from None
    if number < minimum:
        raise InvalidArgumentError(f"--trace-config '{entry}': expected {minimum} or more, got {number}")
    return number
