"""The line between the supervisor and one worker: JSON messages over a Unix socket, each after
its length (4 bytes), which is checked against the line's limit before the message is read.

Either side may ask (`{"ask": N, ...}`) and the other answers (`{"answer": N, "result": ...}`
or `{"answer": N, "error": {"kind": ..., "message": ...}}`), in any order. An error travels as
the name of its `coreserve.errors` class and its message, so the client of the server that
asked sees the same status code and words as from one server; bytes travel as base64.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from coreserve import errors
from coreserve.errors import CoreserveError, InternalError, UnavailableError
from coreserve.server.options import ServerOptions
from coreserve.server.workers._trust import LINE_ERRORS, MALFORMED, OVERSIZED

logger = logging.getLogger(__name__)

BYTES = "__bytes__"
_LENGTH = struct.Struct("!I")
# Beside a load request's files: the other messages (statistics, every worker's metrics text).
_ROOM_BESIDE_FILES = 64 * 1024 * 1024


def message_limit(options: ServerOptions) -> int:
    """The largest message a line takes: a load request's files as base64 (at most the largest
    request a frontend takes), and room for the rest."""
    largest_request = max(options.grpc_max_message_size, options.http_max_input_size)
    return largest_request * 4 // 3 + _ROOM_BESIDE_FILES


Handler = Callable[[dict[str, Any]], Awaitable[Any]]


class ChannelClosed(UnavailableError):
    """The other side went away before it answered."""


class _Malformed(ValueError):
    """A message that is not an ask or an answer."""


class Channel:
    """One end of the line. `handle` answers what the other side asks; `limit`: the largest
    message taken (a larger one, or one that cannot be read, closes the line)."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, handle: Handler, limit: int
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._handle = handle
        self._limit = limit
        self._asked: dict[int, asyncio.Future[Any]] = {}
        self._next = 0
        self._answering: set[asyncio.Task[None]] = set()
        self.closed = asyncio.Event()
        self._reading = asyncio.create_task(self._read())

    async def ask(self, message: dict[str, Any], timeout: float | None = None) -> Any:
        """Sends `message` and waits for its answer (at most `timeout` seconds); raises the
        other side's error as its class, ChannelClosed, or UnavailableError past the timeout."""
        if self.closed.is_set():
            raise ChannelClosed("the worker line is closed")
        self._next += 1
        number = self._next
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._asked[number] = answer
        try:
            self._send({**message, "ask": number})
            return await asyncio.wait_for(answer, timeout)
        except TimeoutError:
            raise UnavailableError(
                f"a worker did not answer '{message.get('call')}' within {timeout:g} s"
            ) from None
        finally:
            self._asked.pop(number, None)

    def _send(self, message: dict[str, Any]) -> None:
        body = orjson.dumps(message, default=_encode)
        self._writer.writelines([_LENGTH.pack(len(body)), body])

    async def _read(self) -> None:
        try:
            while (message := await self._next_message()) is not None:
                if "answer" in message:
                    self._answered(message)
                else:
                    task = asyncio.create_task(self._answer(message))
                    self._answering.add(task)
                    task.add_done_callback(self._answering.discard)
        except ConnectionError as exc:
            logger.warning("worker line broken: %s", exc)
        except _Malformed as exc:
            LINE_ERRORS.count(MALFORMED)
            logger.warning("worker line closed: a message that cannot be read (%s)", exc)
        except Exception:  # a fault of ours: this line ends, its process goes on
            logger.exception("worker line failed")
        finally:
            self.closed.set()
            self._writer.close()  # the other side sees the end too
            for waiting in self._asked.values():
                if not waiting.done():
                    waiting.set_exception(ChannelClosed("the other end of the worker line went away"))

    async def _next_message(self) -> dict[str, Any] | None:
        """The next message (None at the end of the line, or past the limit: then counted)."""
        try:
            (size,) = _LENGTH.unpack(await self._reader.readexactly(_LENGTH.size))
            if size > self._limit:
                LINE_ERRORS.count(OVERSIZED)
                logger.warning("worker line closed: a message of %d bytes (at most %d)", size, self._limit)
                return None
            body = await self._reader.readexactly(size)
        except asyncio.IncompleteReadError:
            return None
        try:
            message = _decoded(orjson.loads(body))
        except (ValueError, TypeError) as exc:  # not JSON, or bytes that are not base64
            raise _Malformed(str(exc)) from None
        if not isinstance(message, dict) or not (
            (isinstance(message.get("answer"), int) and isinstance(message.get("error", {}), dict))
            or (isinstance(message.get("ask"), int) and isinstance(message.get("call"), str))
        ):
            raise _Malformed("neither an ask nor an answer")
        return message

    def _answered(self, message: dict[str, Any]) -> None:
        waiting = self._asked.get(message["answer"])
        if waiting is None or waiting.done():
            return
        if "error" in message:
            waiting.set_exception(error_from(message["error"]))
        else:
            waiting.set_result(message.get("result"))

    async def _answer(self, message: dict[str, Any]) -> None:
        number = message.pop("ask")
        try:
            result = await self._handle(message)
        except CoreserveError as exc:
            reply: dict[str, Any] = {"answer": number, "error": error_data(exc)}
        except Exception as exc:  # a fault here: the asker gets it as an internal error, the log the trace
            logger.exception("worker line: %s failed", message.get("call"))
            reply = {"answer": number, "error": error_data(exc)}
        else:
            reply = {"answer": number, "result": result}
        # (A line closed while the request ran: uvloop's transport raises on a write then.)
        if not self.closed.is_set() and not self._writer.is_closing():
            with contextlib.suppress(ConnectionError):
                try:
                    self._send(reply)
                except TypeError as exc:  # an answer that cannot travel: the asker gets why
                    logger.exception("worker line: the answer to %s cannot be sent", message.get("call"))
                    self._send({"answer": number, "error": error_data(exc)})

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(ConnectionError):
            await self._writer.wait_closed()
        await self._reading


def _encode(value: Any) -> Any:
    """What JSON has no word for: bytes (a load request's files, a CUDA handle) as base64."""
    if isinstance(value, bytes | bytearray | memoryview):
        return {BYTES: base64.b64encode(value).decode()}
    raise TypeError(f"{type(value).__name__} does not travel between workers")


def _decoded(value: Any) -> Any:
    if isinstance(value, dict):
        if len(value) == 1 and BYTES in value:
            return base64.b64decode(value[BYTES])
        return {key: _decoded(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_decoded(item) for item in value]
    return value


def error_data(error: Exception) -> dict[str, str]:
    """An error as it travels: its class's name, its code and its message."""
    if not isinstance(error, CoreserveError):
        error = InternalError(f"{type(error).__name__}: {error}")
    return {"kind": type(error).__name__, "code": error.code.value, "message": error.message}


def error_from(data: dict[str, str]) -> CoreserveError:
    """The error `error_data` made: of its class where `coreserve.errors` has it, else of the
    class of its code (an error class of another module keeps its status code)."""
    kind = getattr(errors, data.get("kind", ""), None)
    if not (isinstance(kind, type) and issubclass(kind, CoreserveError)):
        kind = _BY_CODE.get(data.get("code", ""), InternalError)
    return kind(data.get("message", ""))


_BY_CODE: dict[str, type[CoreserveError]] = {
    error.code.value: error
    for error in (
        errors.InvalidArgumentError, errors.NotFoundError, errors.UnavailableError, errors.UnsupportedError,
        errors.AlreadyExistsError, errors.CancelledError, errors.PermissionDeniedError, errors.InternalError,
    )
}  # fmt: skip
