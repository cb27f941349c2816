"""The requests an instance has given to its stub and not yet answered in full, by key.

The stub knows each request by a key the instance gives it (`RequestItem.key`); its responses,
cancellations and BLS calls name that key. `OpenRequests` keeps each open request with its
responder and the function that stops relaying its cancellation to the stub, and answers them
from the stub's responses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

from coreserve import InferenceRequest
from coreserve.backend import Responder, is_request_field
from coreserve_python.ipc import SEQUENCE_END, SEQUENCE_START, RequestItem, ResponseBody, TensorRef
from coreserve_python.server._error_codes import error_for

# An open request: the request, its responder, and what stops relaying its cancellation.
Entry = tuple[InferenceRequest, Responder, Callable[[], None]]


class OpenRequests:
    """The open requests of one instance, by key (keys grow with the order they were given in)."""

    def __init__(self, relay_cancel: Callable[[int], None], decoupled: bool) -> None:
        """`relay_cancel(key)`: tells the stub that the request it knows by `key` was cancelled;
        `decoupled`: the model's transaction policy."""
        self._entries: dict[int, Entry] = {}
        self._next_key = 0
        self._relay_cancel = relay_cancel
        # An ordinary model's response sent without the final flag (its response sender), by
        # key: the request's one response, given once the flag follows.
        self._held: dict[int, tuple[ResponseBody, dict[str, Any]]] | None = None if decoupled else {}

    def add(self, request: InferenceRequest, responder: Responder) -> int:
        """Opens a request given to the stub; returns its key."""
        key = self._next_key
        self._next_key += 1
        self._entries[key] = (request, responder, request.on_cancel(partial(self._relay_cancel, key)))
        return key

    def request(self, key: int) -> InferenceRequest | None:
        """The open request the stub knows by `key`; None once it is answered in full."""
        entry = self._entries.get(key)
        return entry[0] if entry is not None else None

    def entries(self) -> list[tuple[int, Entry]]:
        """The open requests as they are now (closing one meanwhile is allowed)."""
        return list(self._entries.items())

    def close(self, key: int) -> Entry | None:
        """Forgets an open request (its last response is given); None if it was not open."""
        entry = self._entries.pop(key, None)
        if entry is not None:
            entry[2]()
            if self._held:
                self._held.pop(key, None)
        return entry

    def close_all(self, keys: Iterable[int]) -> None:
        """Forgets the open requests of an execution that was never sent to the stub."""
        for key in keys:
            self.close(key)

    def answer_held(self, key: int) -> bool:
        """Gives an ordinary model's held response (its sender's, the flag still to come) as the
        request's answer; False if none is held. Triton's client gets that response when the
        model then fails (the error comes second: a stream drops it)."""
        held = self._held.pop(key, None) if self._held else None
        if held is None:
            return False
        self.answer([(key, held[0], True)], [held[1]])
        return True

    def answer(
        self, items: list[tuple[int, ResponseBody | None, bool]], outputs_of: list[dict[str, Any]]
    ) -> None:
        """Gives the stub's responses (key, body or None for a bare final, final) to their requests."""
        for (key, body, final), outputs in zip(items, outputs_of, strict=True):
            entry = self._entries.get(key)
            if entry is None:
                continue
            request, responder, _ = entry
            if not responder.is_open(request):  # (ended meanwhile by the server: one too late)
                self.close(key)
                continue
            if self._held is not None:  # an ordinary model's: one response, with the final flag
                if not final:
                    if body is not None:
                        self._held[key] = (body, outputs)
                    continue
                if body is None and key in self._held:
                    body, outputs = self._held[key]
            if final:
                self.close(key)
            if body is None:
                responder.send_final(request)
            elif body["error"] is not None:  # without the final flag: the request goes on, as on Triton
                text, code = body["error"]
                responder.send_error(request, error_for(code, text), final=final)
            else:
                responder.send(request, outputs, parameters=body["parameters"], final=final)


def request_item(
    key: int, request: InferenceRequest, inputs: list[TensorRef], outputs: list[str]
) -> RequestItem:
    """A request as an `execute` message carries it to the stub."""
    parameters = request.parameters
    flags = (SEQUENCE_START if parameters.get("sequence_start") else 0) | (
        SEQUENCE_END if parameters.get("sequence_end") else 0
    )
    sequence_id = parameters.get("sequence_id", 0)
    item: RequestItem = {
        "key": key,
        "id": request.id,
        "inputs": inputs,
        "requested": list(request.requested_outputs) if request.requested_outputs is not None else outputs,
        # (a model sees those as correlation_id(), flags() and timeout(), as on Triton)
        "parameters": {name: value for name, value in parameters.items() if not is_request_field(name)},
        # pb_utils gives a correlation ID as int or str, as Triton does
        "correlation_id": sequence_id if isinstance(sequence_id, int | str) else int(sequence_id),
        "flags": flags,
        "cancelled": request.is_cancelled(),
    }
    timeout = parameters.get("timeout")
    if type(timeout) is int and timeout > 0:
        item["timeout"] = timeout
    return item
