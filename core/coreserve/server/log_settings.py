"""The server's log settings: set by the log flags, read and changed by the logging extension.

`--log-verbose N`, `--log-info/--log-warning/--log-error BOOL`, `--log-format default|ISO8601`
and `--log-file PATH` set them at start-up; `GET/POST /v2/logging` and gRPC `LogSettings`
read and change them at run time, through `ServerLog.update`, which checks every change
before applying any. As in Triton 2.51, the log file cannot be changed over the network (a
client could otherwise make the server write wherever it may).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import IO, Any

from coreserve.errors import InvalidArgumentError, UnsupportedError, clipped, quoted_value

LOG_FORMATS = ("default", "ISO8601")
ESCAPE_VARIABLE = "TRITON_SERVER_ESCAPE_LOG_MESSAGES"
# Triton's letters: a verbose entry is an I, as its info entries are.
_LEVEL_LETTERS = {logging.ERROR: "E", logging.WARNING: "W"}
_BOOL_SETTINGS = ("log_info", "log_warning", "log_error")


@dataclass(frozen=True)
class LogSettings:
    """Triton's log settings, with its names and defaults (field order: Triton's answer's)."""

    log_file: str = ""  # empty: standard error
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: str = "default"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class StartupLogError(Exception):
    """The log file of --log-file cannot be opened."""


class TritonLogFormatter(logging.Formatter):
    """Entries as Triton 2.51 writes them (its logging extension's "Logging Formats"):
    `I1123 16:04:21.470339 4807 loader.py:212] "message"`, or ISO 8601's form.

    The message is JSON-encoded (quoted, its new lines and control characters escaped: one entry,
    one line, and a client's text cannot forge another entry), unless the server started with
    TRITON_SERVER_ESCAPE_LOG_MESSAGES=0. A record may carry, as `extra`:
    - `source`: the `file:line` the entry names, where it is not the logging call's own (a line a
      backend relays from a model's code);
    - `table` (true): the message is a table, written as is on the lines after the entry's
      empty heading, as Triton's multi-line entries.
    """

    def __init__(self, iso8601: bool, escaped: bool = True) -> None:
        super().__init__("%(message)s")
        self.iso8601 = iso8601
        self.escaped = escaped

    def format(self, record: logging.LogRecord) -> str:
        message = super().format(record)  # with the traceback of an exception, if any
        if getattr(record, "table", False):
            message = "\n" + message
        elif self.escaped and message:
            message = json.dumps(message, ensure_ascii=False)
        level = _LEVEL_LETTERS.get(record.levelno) or ("E" if record.levelno > logging.ERROR else "I")
        source = getattr(record, "source", None) or f"{record.filename}:{record.lineno}"
        if self.iso8601:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))
            return f"{stamp} {level} {record.process} {source}] {message}"
        local = time.localtime(record.created)
        micros = int((record.created % 1) * 1_000_000)
        stamp = time.strftime("%m%d %H:%M:%S", local)
        return f"{level}{stamp}.{micros:06d} {record.process} {source}] {message}"


def escaping_log_messages() -> bool:
    """Whether log messages are JSON-encoded: yes, unless TRITON_SERVER_ESCAPE_LOG_MESSAGES says 0
    (read at start-up, as Triton does; the logging extension cannot change it)."""
    return os.environ.get(ESCAPE_VARIABLE, "1").strip() != "0"


class _LevelSwitches(logging.Filter):
    """Drops records of the levels the settings turn off."""

    def __init__(self, log: ServerLog) -> None:
        super().__init__()
        self._log = log

    def filter(self, record: logging.LogRecord) -> bool:
        settings = self._log.settings
        if record.levelno >= logging.ERROR:
            return settings.log_error
        if record.levelno >= logging.WARNING:
            return settings.log_warning
        if record.levelno >= logging.INFO:
            return settings.log_info
        return settings.log_verbose_level > 0


class ServerLog:
    """The server's logging: one handler on the root logger, shaped by the current settings."""

    def __init__(self, settings: LogSettings | None = None) -> None:
        self.settings = settings or LogSettings()
        _check(self.settings)
        self._handler: logging.Handler | None = None
        self._escaped = escaping_log_messages()

    def install(self) -> None:
        """Sends every log record through this log's handler (to the log file, or standard error).

        Raises StartupLogError when the log file cannot be opened for appending.
        """
        stream: IO[str]
        if self.settings.log_file:
            try:
                stream = open(self.settings.log_file, "a", encoding="utf-8", buffering=1)  # noqa: SIM115
            except OSError as exc:
                raise StartupLogError(
                    f"cannot write the log file '{self.settings.log_file}' (--log-file): {exc.strerror}"
                ) from None
        else:
            stream = sys.stderr
        handler = logging.StreamHandler(stream)
        handler.addFilter(_LevelSwitches(self))
        root = logging.getLogger()
        for old in list(root.handlers):
            root.removeHandler(old)
        root.addHandler(handler)
        self._handler = handler
        self._apply()

    def update(self, changes: Mapping[str, Any]) -> LogSettings:
        """Applies a change of settings, all or nothing; returns the settings now in force.

        Raises InvalidArgumentError for an unknown setting or a value of the wrong type, and
        UnsupportedError for a change of the log file (Triton's rule).
        """
        values: dict[str, Any] = {}
        for key, value in changes.items():
            if key == "log_file":
                raise UnsupportedError("log file location can not be updated through network protocol")
            if key in _BOOL_SETTINGS:
                if type(value) is not bool:
                    raise InvalidArgumentError(f"expect boolean for '{key}', got {quoted_value(value)}")
            elif key == "log_verbose_level":  # Triton's words first, then what came
                if type(value) is not int or not 0 <= value < 2**31:
                    raise InvalidArgumentError(
                        f"expect int32 for 'log_verbose_level', got {quoted_value(value)} (0 or more)"
                    )
            elif key == "log_format":
                if not isinstance(value, str):
                    raise InvalidArgumentError(f"expect string for 'log_format', got {quoted_value(value)}")
                if value not in LOG_FORMATS:
                    raise InvalidArgumentError(
                        f"invalid argument for log_format, got: {clipped(value)} "
                        "(expected default or ISO8601)"
                    )
            else:
                known = ", ".join(LogSettings().as_dict())
                raise InvalidArgumentError(f"unknown log setting '{clipped(key)}'; known: {known}")
            values[key] = value
        if values:
            self.settings = replace(self.settings, **values)
            self._apply()
        return self.settings

    def _apply(self) -> None:
        if self._handler is None:
            return
        self._handler.setFormatter(TritonLogFormatter(self.settings.log_format == "ISO8601", self._escaped))
        verbose = self.settings.log_verbose_level > 0
        logging.getLogger().setLevel(logging.DEBUG if verbose else logging.INFO)


def _check(settings: LogSettings) -> None:
    if settings.log_format not in LOG_FORMATS:
        raise InvalidArgumentError(f"unknown log format '{settings.log_format}'; expected default or ISO8601")
    if settings.log_verbose_level < 0:
        raise InvalidArgumentError(f"the verbose level must be 0 or more, got {settings.log_verbose_level}")
