"""Merging a batch of requests into one framework call, and splitting the outputs back.

Framework backends call `run_batched` from `execute`; the merge and split logic lives here
once, so that each plugin only says how to run its framework on a dict of arrays.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from coreserve.backend._threads import InstanceThread
from coreserve.backend.responder import Responder
from coreserve.backend.tensors._ragged import is_ragged, merge_ragged, split_ragged
from coreserve.errors import CoreserveError, InternalError
from coreserve.types import InferenceRequest

Arrays = dict[str, np.ndarray]
InferFunction = Callable[[Arrays, Sequence[str]], Arrays]
InputConverter = Callable[[str, np.ndarray], np.ndarray]


async def run_batched(
    requests: Sequence[InferenceRequest],
    responder: Responder,
    infer: InferFunction,
    *,
    thread: InstanceThread | None = None,
    convert_input: InputConverter | None = None,
) -> None:
    """Runs `infer(inputs, output_names)` once for the whole batch and answers each request.

    Inputs are concatenated along the batch dimension (a batch of one is passed as is);
    each request then gets its own rows of every output it asked for. A model configured for
    ragged batching gets its ragged inputs flat and its batch inputs, and each request its part
    of the batch outputs (see `coreserve.backend.tensors._ragged`). A blocking `infer`
    runs through the instance's `thread`; without one it runs inline. `convert_input`
    adapts one request's input for the framework; if it raises, only that request fails.
    """
    if convert_input is not None:
        requests = _converted(requests, responder, convert_input)
        if not requests:
            return
    signature = responder.signature
    ragged = is_ragged(signature)
    if ragged:
        inputs = merge_ragged(requests, signature)
    else:
        inputs = requests[0].inputs if len(requests) == 1 else _concatenate(requests)
    output_names = _output_names(requests, list(signature.model_outputs))
    responder.mark_inputs_ready()
    try:
        outputs = (
            infer(inputs, output_names) if thread is None else await thread.run(infer, inputs, output_names)
        )
    except CoreserveError as exc:
        responder.fail_open_requests(exc)
        return
    except Exception as exc:
        responder.fail_open_requests(
            InternalError(f"model '{signature.model_name}' failed to execute: {type(exc).__name__}: {exc}")
        )
        return
    responder.mark_infer_done()
    if ragged:
        try:
            parts = split_ragged(outputs, requests, signature)
        except CoreserveError as exc:
            responder.fail_open_requests(exc)
            return
        for request, part in zip(requests, parts, strict=True):
            responder.send(request, part)
        return
    if len(requests) == 1:
        responder.send(requests[0], outputs)
        return
    total = sum(request.batch_size for request in requests)
    for name, array in outputs.items():
        if array.ndim == 0 or array.shape[0] != total:
            responder.fail_open_requests(
                InternalError(
                    f"model '{signature.model_name}' returned output '{name}' with shape {list(array.shape)} "
                    f"for a batch of {total}"
                )
            )
            return
    start = 0
    for request in requests:
        stop = start + request.batch_size
        responder.send(request, {name: array[start:stop] for name, array in outputs.items()})
        start = stop


def _converted(
    requests: Sequence[InferenceRequest], responder: Responder, convert: InputConverter
) -> list[InferenceRequest]:
    usable = []
    for request in requests:
        try:
            request.inputs = {name: convert(name, array) for name, array in request.inputs.items()}
        except CoreserveError as exc:
            responder.send_error(request, exc)
            continue
        usable.append(request)
    return usable


def _concatenate(requests: Sequence[InferenceRequest]) -> dict[str, np.ndarray]:
    names = requests[0].inputs.keys()
    return {name: np.concatenate([request.inputs[name] for request in requests]) for name in names}


def _output_names(requests: Sequence[InferenceRequest], all_outputs: list[str]) -> list[str]:
    wanted: dict[str, None] = {}
    for request in requests:
        if request.requested_outputs is None:
            return all_outputs
        wanted.update(dict.fromkeys(request.requested_outputs))
    return [name for name in all_outputs if name in wanted]
