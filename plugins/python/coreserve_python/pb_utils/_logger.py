"""`Logger` of `triton_python_backend_utils`: a model's log lines, in the server's log."""

from __future__ import annotations

import enum
import os
import sys

import coreserve_python.pb_utils.runtime as _runtime


def _caller() -> str:
    """The `file:line` of the model's code that logs: the server's log names it, as Triton's does."""
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


class Logger:
    """Log lines that appear in the server's log, named by the model's file and line."""

    class LogLevel(enum.IntEnum):
        INFO = 0
        WARNING = 1
        ERROR = 2
        VERBOSE = 3

    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message: str | bytes, level: LogLevel = LogLevel.INFO) -> None:
        # A message of text and a LogLevel, or a TypeError, as Triton's bindings take them.
        if not isinstance(message, str | bytes) or not isinstance(level, Logger.LogLevel):
            raise TypeError(
                "log(): incompatible function arguments: a message (str) and a pb_utils.Logger.LogLevel, "
                f"got {type(message).__name__} and {type(level).__name__}"
            )
        text = message.decode("utf-8", "replace") if isinstance(message, bytes) else message
        runtime = _runtime.current()
        if runtime is None:
            print(f"{level.name}: {text}", file=sys.stderr)
        else:
            runtime.log(level.name, text, _caller())

    @staticmethod
    def log_info(message: str) -> None:
        Logger.log(message, Logger.INFO)

    @staticmethod
    def log_warn(message: str) -> None:
        Logger.log(message, Logger.WARNING)

    @staticmethod
    def log_error(message: str) -> None:
        Logger.log(message, Logger.ERROR)

    @staticmethod
    def log_verbose(message: str) -> None:
        Logger.log(message, Logger.VERBOSE)
