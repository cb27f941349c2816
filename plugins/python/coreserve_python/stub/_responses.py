"""An ordinary model's return value as Triton's Python backend takes it, and responses as the
`responses` message that carries them to the server."""

from __future__ import annotations

from typing import Any

from coreserve_python import pb_utils
from coreserve_python.ipc import ResponseBody, ResponsesMessage, SegmentPool, write_groups

# A request's key, its response (None: a bare final flag) and whether it is the last one.
Item = tuple[int, pb_utils.InferenceResponse | None, bool]


def returned_responses(
    requests: list[pb_utils.InferenceRequest], result: Any, deferred: list[int]
) -> tuple[list[Item], str | None]:
    """What an ordinary model's execute returned, as items to send, or why Triton refuses it
    (in Triton's words). A request whose response sender the model took may be left None: its
    sender answers it (or has): its key goes into `deferred`."""
    if result is None:  # (Triton takes it: the senders answer, or the requests wait)
        result = [None] * len(requests)
    if not isinstance(result, list):
        return [], f"Expected a list in the execute return, found type '{type(result)}'."
    if len(result) != len(requests):
        return [], (
            "Number of InferenceResponse objects do not match the number of InferenceRequest "
            f"objects. InferenceRequest(s) size is:{len(requests)}, and InferenceResponse(s) size "
            f"is:{len(result)}\n"
        )
    items: list[Item] = []
    for request, response in zip(requests, result, strict=True):
        if request._rescheduled():
            if response is not None:  # Triton's check (and its spelling)
                return [], (
                    "Expected a None object in the execute function return list for reschduled "
                    f"request, found type '{type(response)}'."
                )
            continue  # answered by a later execution
        # (every request given to execute() has its key)
        key, sender = request._key or 0, request._sender
        if sender is not None:
            if response is None:  # (closed or not: what it sent may still be on its way)
                deferred.append(key)
                continue
            try:  # the returned response is the sender's one response
                sender._count(response, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            except pb_utils.TritonModelException as exc:
                return [], exc.message()
        items.append((key, response, True))
    return items, None


def responses_message(pool: SegmentPool, items: list[Item]) -> ResponsesMessage:
    """Responses as a `responses` message; their tensors go into one segment (or inline)."""
    groups: list[list[tuple[str, Any]]] = []
    for _, response, _ in items:
        group = []
        for tensor in response.output_tensors() if response is not None else ():
            if not isinstance(tensor, pb_utils.Tensor):
                raise pb_utils.TritonModelException(f"output_tensors must be pb_utils.Tensor, got {tensor!r}")
            group.append((tensor.name(), tensor._host_array()))
        groups.append(group)
    segment, refs = write_groups(pool, groups)
    encoded: list[tuple[int, ResponseBody | None, bool]] = []
    for (key, response, final), outputs in zip(items, refs, strict=True):
        body: ResponseBody | None = None
        if response is not None:
            error = response.error()
            body = {
                "outputs": outputs,
                "error": (error.message(), error.code()) if error is not None else None,
                "parameters": response._parameters,
            }
        encoded.append((key, body, final))
    return {"op": "responses", "segment": segment, "items": encoded}
