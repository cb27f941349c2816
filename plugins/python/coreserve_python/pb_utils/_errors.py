"""The errors of `triton_python_backend_utils`: an error in a response, and the exception."""

from __future__ import annotations


class TritonError:
    """An error in a response; `code` is one of the class constants."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = str(message)
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._code})"


class TritonModelException(Exception):
    """Raised by pb_utils calls that fail; a model may raise it too."""

    def message(self) -> str:
        return str(self.args[0]) if self.args else ""
