"""The trace settings: set by `--trace-config`, read and changed by the trace extension.

One global setting and, per model, the fields a client chose for that model; a model's
answer is the global setting with its own fields over it (a field it never set follows the
global one as it changes, as in Triton 2.51). `GET/POST /v2/trace/setting`,
`/v2/models/{m}/trace/setting` and gRPC `TraceSetting` all go through `TraceSettings.update`,
which checks every change before applying any.

The wire form is Triton's: every value a string, `trace_level` a list of strings, and `null`
(gRPC: an empty value list) clears a setting: a model's setting then follows the global one
again, a global setting returns to its start-up value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from coreserve.errors import InvalidArgumentError, UnsupportedError, clipped, quoted_value

LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
MODES = ("triton", "opentelemetry")
# The answer's keys, in the order Triton writes them.
SETTING_KEYS = ("trace_level", "trace_rate", "trace_count", "log_frequency", "trace_file", "trace_mode")
_CHANGEABLE = ("trace_level", "trace_rate", "trace_count", "log_frequency")
MAX_RATE = 2**32 - 1  # Triton's: an unsigned 32-bit number
MAX_COUNT = 2**31 - 1  # Triton's: a signed 32-bit number
MAX_LOG_FREQUENCY = 2**32 - 1  # Triton's: an unsigned 32-bit number


@dataclass(frozen=True)
class TraceSetting:
    """One trace setting (global, or a model's), with Triton's defaults."""

    trace_level: tuple[str, ...] = ("OFF",)
    trace_rate: int = 1000  # every N-th request is traced
    trace_count: int = -1  # traces left to take; -1: no limit
    log_frequency: int = 0  # write the file every N traces; 0: at shut-down only
    trace_file: str = ""
    trace_mode: str = "triton"

    @property
    def traces(self) -> bool:
        """True when this setting traces anything (a level other than OFF, traces left)."""
        return self.trace_count != 0 and any(level != "OFF" for level in self.trace_level)

    @property
    def tensors(self) -> bool:
        return "TENSORS" in self.trace_level

    def as_dict(self) -> dict[str, Any]:
        """The setting as Triton answers it: strings, and a list for the level."""
        return {
            "trace_level": list(self.trace_level),
            "trace_rate": str(self.trace_rate),
            "trace_count": str(self.trace_count),
            "log_frequency": str(self.log_frequency),
            "trace_file": self.trace_file,
            "trace_mode": self.trace_mode,
        }


class TraceSettings:
    """The global trace setting and the models' own fields over it."""

    def __init__(self, startup: TraceSetting | None = None) -> None:
        self.startup = startup or TraceSetting()
        check_setting(self.startup)
        self.global_setting = self.startup
        self._model_fields: dict[str, dict[str, Any]] = {}
        self._model_settings: dict[str, TraceSetting] = {}
        self.version = 0  # bumped by every change, so that samplers know to look again

    def setting(self, model: str = "") -> TraceSetting:
        """The setting in force for `model` ("" for the global one)."""
        if not model:
            return self.global_setting
        return self._model_settings.get(model, self.global_setting)

    def has_own(self, model: str) -> bool:
        """True when `model` has fields of its own (then it samples and counts on its own)."""
        return model in self._model_settings

    def any_traces(self) -> bool:
        """True when some setting traces: the one check the request path makes when tracing is off."""
        return self.global_setting.traces or any(s.traces for s in self._model_settings.values())

    def update(self, changes: Mapping[str, Any], model: str = "") -> TraceSetting:
        """Applies a change of the global setting or of a model's, all or nothing.

        Values are as the wire carries them: strings, a list of strings for `trace_level`,
        None to clear. Raises InvalidArgumentError for an unknown setting or a bad value, and
        UnsupportedError for a change of the trace file (Triton's rule).
        """
        parsed: dict[str, Any] = {}
        for key, value in changes.items():
            if key == "trace_file":
                raise UnsupportedError("trace file location can not be updated through network protocol")
            if key == "trace_mode":
                if value is not None and value != self.startup.trace_mode:
                    raise InvalidArgumentError(
                        f"trace_mode can be chosen at start-up only (--trace-config mode=...); "
                        f"it is '{self.startup.trace_mode}'"
                    )
                continue
            if key not in _CHANGEABLE:
                known = ", ".join(SETTING_KEYS)
                raise InvalidArgumentError(f"unknown trace setting '{clipped(str(key))}'; known: {known}")
            parsed[key] = None if value is None else parse_value(key, value)
        if model:
            own = dict(self._model_fields.get(model, {}))
            for key, value in parsed.items():
                if value is None:
                    own.pop(key, None)
                else:
                    own[key] = value
            self._check_update(replace(self.global_setting, **own), parsed)
            self._set_model(model, own)
        else:
            values = {k: getattr(self.startup, k) if v is None else v for k, v in parsed.items()}
            self._check_update(replace(self.global_setting, **values), parsed)
            self.global_setting = replace(self.global_setting, **values)
            for name, own in self._model_fields.items():
                self._model_settings[name] = replace(self.global_setting, **own)
        self.version += 1
        return self.setting(model)

    def _check_update(self, setting: TraceSetting, parsed: Mapping[str, Any]) -> None:
        """Refuses, in Triton's words, a change whose setting could not trace: in Triton mode, a
        level on with no trace file or a rate of 0 (a rate of 0 alone is kept while the level is
        OFF); in OpenTelemetry mode a rate of 0 (chosen at start-up only: see check_setting)."""
        invalid = "Attempting to set invalid trace setting :"
        if self.startup.trace_mode != "triton":
            if parsed.get("trace_rate") == 0:
                raise InvalidArgumentError(f"{invalid}sample rate must be non-zero")
            return
        if setting.trace_level != ("OFF",) and not setting.trace_file:
            raise InvalidArgumentError(f"{invalid}trace file name is not given")
        if setting.trace_level != ("OFF",) and setting.trace_rate == 0:
            raise InvalidArgumentError(f"{invalid}sample rate must be non-zero")

    def count_one(self, model: str) -> bool:
        """Takes one trace from the count in force for `model`; False when none is left."""
        setting = self.setting(model)
        if setting.trace_count == 0:
            return False
        if setting.trace_count > 0:
            if model and self.has_own(model) and "trace_count" in self._model_fields[model]:
                own = self._model_fields[model]
                own["trace_count"] = setting.trace_count - 1
                self._model_settings[model] = replace(setting, trace_count=own["trace_count"])
            else:
                self.global_setting = replace(self.global_setting, trace_count=setting.trace_count - 1)
                for name, own in self._model_fields.items():
                    self._model_settings[name] = replace(self.global_setting, **own)
            self.version += 1
        return True

    def _set_model(self, model: str, own: dict[str, Any]) -> None:
        if own:
            self._model_fields[model] = own
            self._model_settings[model] = replace(self.global_setting, **own)
        else:
            self._model_fields.pop(model, None)
            self._model_settings.pop(model, None)


def parse_value(key: str, value: Any) -> Any:
    """One setting's value from its wire form; raises InvalidArgumentError when it is not one."""
    if key == "trace_level":
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value) or not value:
            raise InvalidArgumentError(
                "expect a list of trace levels for 'trace_level' (OFF, TIMESTAMPS, TENSORS), "
                f"got {quoted_value(value)}"
            )
        unknown = [item for item in value if item not in LEVELS]
        if unknown:
            raise InvalidArgumentError(
                f"unknown trace level {quoted_value(unknown[0])} in 'trace_level'; "
                "expected OFF, TIMESTAMPS or TENSORS"
            )
        if "OFF" in value and len(value) > 1:
            raise InvalidArgumentError("Expect only one trace level 'OFF' is specified")
        return tuple(level for level in LEVELS if level in value)  # in Triton's order
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise InvalidArgumentError(f"expect a string for '{key}', got {quoted_value(value)}")
    try:
        number = int(value)
    except ValueError:
        raise InvalidArgumentError(f"Unable to parse '{key}', got: {clipped(str(value))}") from None
    if key == "trace_rate" and number < 0:  # (0: see TraceSettings._check_update)
        raise InvalidArgumentError(f"Unable to parse 'trace_rate'. Expecting value >= 0, got: {number}")
    if key == "trace_rate" and number > MAX_RATE:
        raise InvalidArgumentError(
            f"Unable to parse 'trace_rate', value is out of range [ 0, {MAX_RATE} ], got: {number}"
        )
    if key == "trace_count" and number < -1:
        raise InvalidArgumentError(f"Unable to parse 'trace_count'. Expecting value >= -1, got: {number}")
    if key == "trace_count" and number > MAX_COUNT:
        raise InvalidArgumentError(
            f"Unable to parse 'trace_count', value is out of range [ -1, {MAX_COUNT} ], got: {number}"
        )
    if key == "log_frequency" and number < 0:
        raise InvalidArgumentError(f"Unable to parse 'log_frequency'. Expecting value >= 0, got: {number}")
    if key == "log_frequency" and number > MAX_LOG_FREQUENCY:
        raise InvalidArgumentError(
            f"Unable to parse 'log_frequency', value is out of range [ 0, {MAX_LOG_FREQUENCY} ], "
            f"got: {number}"
        )
    return number


def check_setting(setting: TraceSetting) -> None:
    """Checks a start-up setting; raises InvalidArgumentError naming what is wrong."""
    if setting.trace_mode not in MODES:
        raise InvalidArgumentError(
            f"unknown trace mode '{setting.trace_mode}'; expected triton or opentelemetry"
        )
    for level in setting.trace_level:
        if level not in LEVELS:
            raise InvalidArgumentError(f"unknown trace level '{level}'; expected OFF, TIMESTAMPS or TENSORS")
    # Rate 0 is allowed at start-up only: in OpenTelemetry mode it traces just the requests
    # that carry a client's trace context (Triton's documented use).
    if not 0 <= setting.trace_rate <= MAX_RATE:
        raise InvalidArgumentError(f"the trace rate must be within 0..{MAX_RATE}, got {setting.trace_rate}")
    if not -1 <= setting.trace_count <= MAX_COUNT:
        raise InvalidArgumentError(
            f"the trace count must be within -1..{MAX_COUNT}, got {setting.trace_count}"
        )
    if not 0 <= setting.log_frequency <= MAX_LOG_FREQUENCY:
        raise InvalidArgumentError(
            f"the trace log frequency must be within 0..{MAX_LOG_FREQUENCY}, got {setting.log_frequency}"
        )


@dataclass(frozen=True)
class OpenTelemetryOptions:
    """`--trace-config opentelemetry,...`: where spans go, and the batch span processor's settings."""

    url: str = "http://localhost:4318/v1/traces"
    resource: dict[str, str] = field(default_factory=lambda: {"service.name": "triton-inference-server"})
    bsp_max_queue_size: int = 2048
    bsp_schedule_delay: int = 5000  # milliseconds
    bsp_max_export_batch_size: int = 512


@dataclass(frozen=True)
class TraceConfig:
    """Everything `--trace-config` (and the older --trace-* flags) set."""

    setting: TraceSetting = field(default_factory=TraceSetting)
    opentelemetry: OpenTelemetryOptions = field(default_factory=OpenTelemetryOptions)
