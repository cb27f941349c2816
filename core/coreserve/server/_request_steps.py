"""Steps of a request's way through the data plane: its timeout, the sink that answers outputs as
their top classes, and the end of its trace."""

from __future__ import annotations

from coreserve.protocol.classification import ClassifyingSink, check_classifiable
from coreserve.repository import ModelVersion
from coreserve.types import InferenceRequest, InferenceResponse, ResponseSink, now_ns


def timeout_s(request: InferenceRequest) -> float | None:
    """The request's `timeout` parameter (Triton's, in microseconds) in seconds; None: none."""
    timeout = request.parameters.get("timeout")
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout <= 0:
        return None
    return timeout / 1e6


def end_trace(request: InferenceRequest, response: InferenceResponse | None, *, finish: bool) -> None:
    """Marks a traced request's end; finishes its trace unless a frontend still sends the answer."""
    trace = request.trace
    assert trace is not None
    if response is not None:
        trace.outputs(response.outputs)
    trace.request_end(now_ns())
    context = request.trace_context
    if finish or context is None or not context.protocol:
        trace.finish()


def classifying(model_version: ModelVersion, counts: dict[str, int], sink: ResponseSink) -> ResponseSink:
    """Wraps `sink` so that the outputs named in `counts` reach it as their top classes."""
    signature = model_version.signature
    for name in counts:
        spec = signature.outputs.get(name)
        if spec is not None:  # refused before the model runs, rather than after as Triton does
            check_classifiable(spec.datatype, name)
    return ClassifyingSink(sink, counts, model_version.labels, signature.batching)
