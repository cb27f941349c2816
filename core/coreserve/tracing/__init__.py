"""Request tracing: the trace extension's settings, Triton's trace file, OpenTelemetry spans.

OpenTelemetry is an optional extra (`core-server[opentelemetry]`), imported only when
`--trace-config mode=opentelemetry` asks for it.

Layer 1: may import coreserve's errors and types only.
"""

from __future__ import annotations

from coreserve.tracing._settings import OpenTelemetryOptions, TraceConfig, TraceSetting, TraceSettings
from coreserve.tracing._tracer import Tracer, TraceStartupError
from coreserve.tracing.trace import RequestTrace

__all__ = [
    "OpenTelemetryOptions",
    "RequestTrace",
    "TraceConfig",
    "TraceSetting",
    "TraceSettings",
    "TraceStartupError",
    "Tracer",
]
