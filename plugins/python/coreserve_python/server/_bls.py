"""The server's side of a model's BLS requests: runs them through the server, answers the stub.

A `PythonInstance` owns one `BlsServing`, and hands it the model's BLS requests.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from coreserve import CoreserveError, InferenceRequest, UnavailableError
from coreserve.backend import ServerContext
from coreserve_python.ipc import (
    SEQUENCE_END,
    SEQUENCE_START,
    BlsResponseBody,
    BlsResponseMessage,
    Message,
    SegmentPool,
    SegmentReader,
    segment_to_release,
)
from coreserve_python.pb_utils import TritonError
from coreserve_python.server._error_codes import code_of

logger = logging.getLogger("coreserve.backend.python")


class BlsServing:
    """Runs one instance's BLS requests through the server's in-process client."""

    def __init__(
        self,
        name: str,
        server: ServerContext,
        pool: SegmentPool,
        reader: SegmentReader,
        request_of: Callable[[int], InferenceRequest | None],
        send: Callable[[Mapping[str, Any]], None],
    ) -> None:
        """`name`: the instance's, for the log; `pool` and `reader`: the instance's segments;
        `request_of`: the open request the stub knows by a key (None once answered);
        `send`: sends a message to the instance's stub."""
        self._name = name
        self._server = server
        self._pool = pool
        self._reader = reader
        self._request_of = request_of
        self._send = send
        # The server-side requests of BLS calls in flight, by the stub's call id (to cancel them).
        self._calls: dict[int, InferenceRequest] = {}

    def cancel(self, call: int) -> None:
        """The model cancelled a decoupled BLS call it made."""
        request = self._calls.get(call)
        if request is not None:
            request.cancel()

    async def serve(self, message: Message) -> None:
        """Runs a BLS request from the model through the server and sends back its responses."""
        call = message["call"]
        client = self._server.client
        forget = _nothing
        request = None
        try:
            request = self._bls_request(message)
            self._calls[call] = request
            # The requests whose execute() made this call: cancelling them cancels it.
            parents = [
                parent for key in message.get("parents", ()) if (parent := self._request_of(key)) is not None
            ]
            forget = cancel_with_parents(request, parents)
            # Traced as the child of the request whose trace() it was given, when that one is
            # traced; without trace=, not traced (as Triton).
            key = message.get("trace_parent")
            request.trace_as_child_of(self._request_of(key) if key is not None else None)
            if client is None:
                raise UnavailableError("this server offers no in-process client for BLS requests")
            if message["decoupled"]:
                # As Triton's iterator: the final flag ends it with the response it came with,
                # and with an empty response only where it came alone.
                async for response, final in client.stream_with_flags(request):
                    if response is not None and response.error is not None:
                        if not final:  # a decoupled model's error, not its last: Triton's BLS
                            continue  # iterator leaves it out (checked side by side)
                        response = None
                    if response is None:
                        self._send_bls_response(call, None, None, final=True)
                    else:
                        self._send_bls_response(call, response.outputs, response.parameters, final=final)
            else:
                response = await client.infer(request)
                self._send_bls_response(call, response.outputs, response.parameters, final=True)
        except CoreserveError as exc:
            error = (_bls_error(message["model"], exc, request), code_of(exc))
        except Exception as exc:
            # Not the model's mistake nor the target's answer: a fault of the server, logged
            # once with its traceback. The model still gets an answer, or it would wait forever.
            logger.exception("%s: a BLS request to %r failed in the server", self._name, message["model"])
            error = (
                f"internal error of the server in a BLS request: {type(exc).__name__}: {exc}",
                TritonError.INTERNAL,
            )
        else:
            return
        finally:
            forget()
            self._calls.pop(call, None)
        failed: BlsResponseMessage = {
            "op": "bls_response",
            "call": call,
            "error": error,
            "response": None,
            "segment": None,
            "final": True,
        }
        self._send(failed)

    def _bls_request(self, message: Message) -> InferenceRequest:
        """The server-side request for a BLS request from the model; releases its segment."""
        try:
            arrays = self._reader.arrays(message["segment"], message["inputs"], copy=True)
        finally:
            if (shared := segment_to_release(message["segment"])) is not None:
                self._send({"op": "release", "segments": [shared]})
        parameters = dict(message["parameters"])
        if message.get("timeout"):  # microseconds, the request timeout a client may set too
            parameters["timeout"] = message["timeout"]
        if message["correlation_id"]:
            parameters["sequence_id"] = message["correlation_id"]
            parameters["sequence_start"] = bool(message["flags"] & SEQUENCE_START)
            parameters["sequence_end"] = bool(message["flags"] & SEQUENCE_END)
        return InferenceRequest(
            model_name=message["model"],
            model_version=message["version"],
            id=message["id"],
            inputs=arrays,
            parameters=parameters,
            requested_outputs=tuple(message["requested"]) or None,
        )

    def _send_bls_response(self, call: int, outputs: Any, parameters: Any, final: bool) -> None:
        segment, refs = self._pool.write(list(outputs.items())) if outputs is not None else (None, [])
        body: BlsResponseBody | None = (
            {"outputs": refs, "parameters": parameters or {}} if outputs is not None else None
        )
        answer: BlsResponseMessage = {
            "op": "bls_response",
            "call": call,
            "error": None,
            "response": body,
            "segment": segment,
            "final": final,
        }
        self._send(answer)


def _bls_error(model: str, exc: CoreserveError, request: InferenceRequest | None) -> str:
    """A BLS call's error in Triton's words (request_executor.cc): one refused before it was
    queued names the model, and a model that does not serve the request is "not ready"; one
    that failed in its model is that model's error."""
    if request is not None and request.queued_ns:
        return exc.message
    reason = exc.message
    if reason.startswith("Request for unknown model:"):  # (the server's words for a model not serving)
        reason = f"Failed for execute the inference request. Model '{model}' is not ready."
    return f"Model {model} - Error when running inference: {reason}"


def cancel_with_parents(request: InferenceRequest, parents: list[InferenceRequest]) -> Callable[[], None]:
    """Cancels `request` once every one of `parents` is cancelled; returns what undoes the link.

    A BLS call made by the execute() of a batch serves the whole batch, as far as the server
    can tell: it is cancelled when all of the batch's requests are.
    """
    if not parents:
        return _nothing

    def check() -> None:
        if all(parent.is_cancelled() for parent in parents):
            request.cancel()

    forgets = [parent.on_cancel(check) for parent in parents]

    def forget() -> None:
        for undo in forgets:
            undo()

    return forget


def _nothing() -> None:
    return None
