"""`--trace-config mode=opentelemetry`: each traced request as OpenTelemetry spans over OTLP/HTTP.

Imported only in that mode: the SDK is the optional extra `core-server[opentelemetry]`.
A request made through a frontend gets a top-level span `InferRequest` (from its receive to
its send, Triton's name), under it a span named after the model (request start to end), and
under that `queue` and `compute` spans built from the marks the statistics took. An ensemble
step or a BLS call gets its model span under its parent's model span. A client's W3C
`traceparent` (HTTP header, gRPC metadata) makes the top-level span a child of the client's
span, so the client's trace continues through the server.

Spans are built with explicit times: the marks are monotonic, converted to wall-clock time
by one offset taken at start-up (OpenTelemetry's timestamps are wall-clock).
"""

from __future__ import annotations

import time
from typing import Any

from opentelemetry import trace as trace_api
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from coreserve.tracing._settings import OpenTelemetryOptions
from coreserve.tracing.trace import RequestTrace

_PROPAGATOR = TraceContextTextMapPropagator()
_FRONTEND_PREFIXES = ("HTTP_", "GRPC_")


class OpenTelemetryExporter:
    """Turns finished traces into spans; a batch span processor sends them to the OTLP URL."""

    def __init__(self, options: OpenTelemetryOptions) -> None:
        # The server's own provider, not the global one: an application embedding coreserve
        # keeps its own OpenTelemetry set-up.
        self._provider = TracerProvider(resource=Resource.create(dict(options.resource)))
        self._provider.add_span_processor(
            BatchSpanProcessor(
                OTLPSpanExporter(endpoint=options.url),
                max_queue_size=options.bsp_max_queue_size,
                schedule_delay_millis=options.bsp_schedule_delay,
                max_export_batch_size=options.bsp_max_export_batch_size,
            )
        )
        self._tracer = self._provider.get_tracer("coreserve")
        self._offset_ns = time.time_ns() - time.monotonic_ns()

    def begin(self, trace: RequestTrace) -> None:
        """Opens a request's spans as it is sampled, so that its children can name them as parent."""
        start = self._wall(trace.marks[0][1])
        parent_spans = trace.parent.otel if trace.parent is not None else None
        root = None
        if parent_spans is not None:
            context = trace_api.set_span_in_context(parent_spans[1])
        else:
            traceparent = trace.context.traceparent if trace.context is not None else None
            outer = _PROPAGATOR.extract({"traceparent": traceparent}) if traceparent else None
            root = self._tracer.start_span(
                "InferRequest", context=outer, kind=trace_api.SpanKind.SERVER, start_time=start
            )
            if trace.request_id:  # Triton #6512: the request id on every span of the request
                root.set_attribute("triton.request_id", trace.request_id)
            context = trace_api.set_span_in_context(root)
        request_start = trace.first("REQUEST_START") or trace.marks[0][1]
        model = self._tracer.start_span(
            trace.model_name, context=context, start_time=self._wall(request_start)
        )
        model.set_attribute("triton.model_name", trace.model_name)
        model.set_attribute("triton.model_version", trace.model_version)
        model.set_attribute("triton.trace_id", trace.id)
        if trace.request_id:
            model.set_attribute("triton.request_id", trace.request_id)
        if trace.parent is not None:
            model.set_attribute("triton.parent_id", trace.parent.id)
        trace.otel = (root, model)

    def record(self, trace: RequestTrace) -> None:
        """Closes a finished request's spans, adding its phases as child spans and its marks as events."""
        spans: Any = trace.otel
        if spans is None:
            return
        root, model = spans
        stamps = dict(trace.marks)
        last = trace.marks[-1][1]
        inside = trace_api.set_span_in_context(model)
        if "QUEUE_START" in stamps and "COMPUTE_START" in stamps:
            self._span("queue", inside, stamps["QUEUE_START"], stamps["COMPUTE_START"], [])
        if "COMPUTE_START" in stamps:
            compute_marks = [m for m in trace.marks if m[0].startswith("COMPUTE_")]
            self._span(
                "compute", inside, stamps["COMPUTE_START"], stamps.get("COMPUTE_END", last), compute_marks
            )
        for name, ns in trace.marks:
            if name.startswith(_FRONTEND_PREFIXES):
                if root is not None:
                    root.add_event(name, timestamp=self._wall(ns))
            elif not name.startswith("COMPUTE_"):
                model.add_event(name, timestamp=self._wall(ns))
        model.end(end_time=self._wall(stamps.get("REQUEST_END", last)))
        if root is not None:
            root.end(end_time=self._wall(last))

    def close(self) -> None:
        """Sends the spans still queued, then stops the processor."""
        self._provider.shutdown()

    def _span(
        self, name: str, context: Any, start_ns: int, end_ns: int, events: list[tuple[str, int]]
    ) -> None:
        span = self._tracer.start_span(name, context=context, start_time=self._wall(start_ns))
        for event, ns in events:
            span.add_event(event, timestamp=self._wall(ns))
        span.end(end_time=self._wall(end_ns))

    def _wall(self, monotonic_ns: int) -> int:
        return monotonic_ns + self._offset_ns
