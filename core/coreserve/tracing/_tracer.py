"""Which requests are traced, and where their traces go.

The `Tracer` holds the trace settings (the trace extension changes them through it) and
decides, per request, whether it is traced: every `trace_rate`-th request of a setting,
while its `trace_count` lasts. With tracing off everywhere `active` is False and the request
path checks nothing else.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from coreserve.errors import InvalidArgumentError
from coreserve.tracing._settings import TraceConfig, TraceSetting, TraceSettings
from coreserve.tracing._triton_file import TraceFileError, TritonTraceFile, check_writable, trace_entries
from coreserve.tracing.trace import RequestTrace
from coreserve.types import InferenceRequest

logger = logging.getLogger(__name__)


class TraceStartupError(Exception):
    """The trace configuration cannot be used (a trace file that cannot be written, no SDK)."""


class Tracer:
    """Samples requests into traces and hands finished traces to the trace file or exporter."""

    def __init__(self, config: TraceConfig | None = None) -> None:
        self.config = config or TraceConfig()
        try:
            self.settings = TraceSettings(self.config.setting)
        except InvalidArgumentError as exc:
            raise TraceStartupError(exc.message) from None
        self._samples: dict[str, int] = {}
        self._next_id = 1
        self._id_step = 1
        self._file: TritonTraceFile | None = None
        # In a worker of a server of several but the first: where its Triton-mode traces go
        # (the first worker writes every worker's into the one trace file).
        self.send_entries: Callable[[bytes], None] | None = None
        self._exporter: Any = None
        self.active = self.settings.any_traces()

    def start(self) -> None:
        """Opens what the mode needs; raises TraceStartupError when it cannot."""
        setting = self.settings.startup
        if setting.trace_mode == "opentelemetry":
            try:  # the optional extra, imported only in this mode
                from coreserve.tracing._opentelemetry import OpenTelemetryExporter
            except ImportError as exc:
                raise TraceStartupError(
                    f"--trace-config mode=opentelemetry needs the OpenTelemetry SDK ({exc.name} is missing): "
                    "pip install 'core-server[opentelemetry]'"
                ) from None
            self._exporter = OpenTelemetryExporter(self.config.opentelemetry)
        elif setting.trace_file:
            try:
                check_writable(setting.trace_file)
            except TraceFileError as exc:
                raise TraceStartupError(str(exc)) from None
            self._file = TritonTraceFile(setting.trace_file)
            self._file.log_frequency = setting.log_frequency
        elif self.active:
            logger.warning(
                "tracing is on but no trace file is set (--trace-config triton,file=PATH): traces are dropped"
            )

    def number_traces(self, first: int, step: int) -> None:
        """Numbers this tracer's traces first, first + step, ...: the workers of a server of
        several (worker i of N: i + 1, step N) write into one file without sharing an id."""
        self._next_id, self._id_step = first, step

    def add_entries(self, entries: bytes) -> None:
        """Keeps the entries of a trace that another worker made (Triton mode)."""
        if self._file is not None:
            self._file.add_entries(entries)

    def close(self) -> None:
        """Writes the traces still kept, and flushes the exporter."""
        if self._file is not None:
            self._file.close()
        if self._exporter is not None:
            self._exporter.close()

    def setting(self, model: str = "") -> TraceSetting:
        return self.settings.setting(model)

    def answer(self, model: str = "") -> dict[str, Any]:
        """The setting in force as Triton's trace extension answers it: in OpenTelemetry mode
        without the trace file and log frequency, with the exporter's options instead."""
        answer = self.settings.setting(model).as_dict()
        if answer["trace_mode"] == "opentelemetry":
            del answer["log_frequency"], answer["trace_file"]
            options = self.config.opentelemetry
            answer |= {
                "url": options.url,
                "bsp_max_export_batch_size": str(options.bsp_max_export_batch_size),
                "bsp_schedule_delay": str(options.bsp_schedule_delay),
                "bsp_max_queue_size": str(options.bsp_max_queue_size),
            }
        return answer

    def update(self, changes: Mapping[str, Any], model: str = "") -> TraceSetting:
        """Changes the global setting or a model's (see TraceSettings.update)."""
        setting = self.settings.update(changes, model)
        self.active = self.settings.any_traces()
        if self._file is not None and not model and "log_frequency" in changes:
            self._file.log_frequency = self.settings.global_setting.log_frequency
        return setting

    def trace(self, request: InferenceRequest, model_version: int) -> RequestTrace | None:
        """The trace of `request` if it is sampled, else None."""
        model = request.model_name
        context = request.trace_context
        parent = context.parent if context is not None else None
        setting = self.settings.setting(model)
        tensors = setting.tensors
        if parent is not None:
            tensors = tensors or parent.tensors  # an ensemble step or BLS call is traced with its parent
        else:
            if setting.trace_level == ("OFF",) or (context is not None and not context.sampled):
                return None
            # Triton traces every request that carries a client's trace context, whatever the
            # rate and count (OpenTelemetry mode).
            propagated = (
                self._exporter is not None and context is not None and context.traceparent is not None
            )
            if not propagated:
                if setting.trace_count == 0 or setting.trace_rate == 0:
                    return None
                key = model if self.settings.has_own(model) else ""
                seen = self._samples.get(key, 0) + 1
                self._samples[key] = seen
                if seen % setting.trace_rate or not self.settings.count_one(model):
                    return None
        trace_id = self._next_id
        self._next_id += self._id_step
        recorder: Any = self._exporter if self._exporter is not None else self
        trace = RequestTrace(trace_id, request, model_version, recorder, tensors=tensors, context=context)
        if self._exporter is not None:
            self._exporter.begin(trace)
        return trace

    def record(self, trace: RequestTrace) -> None:
        """Takes a finished trace (Triton mode)."""
        if self._file is None:
            return
        if self.send_entries is not None:
            self.send_entries(trace_entries(trace))
            return
        self._file.add(trace)
        if self.settings.setting(trace.model_name).trace_count == 0 and trace.parent is None:
            self._file.write_numbered()  # Triton writes the file once the count runs out
