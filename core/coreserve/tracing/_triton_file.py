"""Triton's JSON trace file: what `--trace-config mode=triton` writes.

The file is a JSON array of small objects, one per model record, timestamp and tensor,
each naming its trace by `id`, exactly as Triton 2.51 writes it (Triton's
qa/common/trace_summary.py reads it). Traces are kept in memory and written:
every `log_frequency` traces to `<file>.<n>` (n counting from 0), when the trace count runs
out to `<file>.<n>` as well, and at shut-down the rest to `<file>.<n>` once numbered files
were written, or to `<file>` itself when none were.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import orjson

from coreserve.tracing.trace import RequestTrace

logger = logging.getLogger(__name__)
# Where each timestamp stands in Triton's file, after the receive marks and the model record.
_ORDER = {
    name: index
    for index, names in enumerate(
        (
            ("REQUEST_START",),
            ("QUEUE_START",),
            ("COMPUTE_START",),
            ("COMPUTE_INPUT_END",),
            ("COMPUTE_OUTPUT_START",),
            ("COMPUTE_END",),
            ("REQUEST_END",),
            ("HTTP_SEND_START", "GRPC_SEND_START"),
            ("HTTP_SEND_END", "GRPC_SEND_END"),
        )
    )
    for name in names
}
_LAST = len(_ORDER)


class TraceFileError(Exception):
    """The trace file cannot be written."""


def check_writable(path: str) -> None:
    """Raises TraceFileError when `path` (or its numbered siblings) could not be written."""
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise TraceFileError(f"the trace file '{path}' is a folder")
    if not folder.is_dir():
        raise TraceFileError(f"cannot write the trace file '{path}': no folder '{folder}'")
    if not os.access(folder, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise TraceFileError(f"cannot write the trace file '{path}': permission denied")


def trace_entries(trace: RequestTrace) -> bytes:
    """One trace as Triton's file writes it (model record, timestamps, tensors), as JSON entries
    without the enclosing brackets."""
    trace_id = trace.id
    marks = trace.marks
    # Receive marks come before the model record, as in Triton's file.
    leading = 2 if marks and marks[0][0].startswith(("HTTP_", "GRPC_")) else 0
    record: dict[str, Any] = {
        "id": trace_id,
        "model_name": trace.model_name,
        "model_version": trace.model_version,
    }
    if trace.request_id:
        record["request_id"] = trace.request_id
    if trace.parent is not None:
        record["parent_id"] = trace.parent.id
    parts = [_stamp(trace_id, name, ns) for name, ns in marks[:leading]]
    parts.append(orjson.dumps(record))
    # Triton's order; a mark taken late (a response sent before the compute marks) keeps its place.
    rest = sorted(marks[leading:], key=lambda mark: _ORDER.get(mark[0], _LAST))
    tensors = trace.tensor_records
    for name, ns in rest:
        parts.append(_stamp(trace_id, name, ns))
        if tensors and name in ("QUEUE_START", "COMPUTE_END"):
            wanted = name == "QUEUE_START"
            parts.extend(
                _tensor_entry(trace_id, t) for t in tensors if (t.activity == "TENSOR_QUEUE_INPUT") == wanted
            )
    return b",".join(parts)


def _stamp(trace_id: int, name: str, ns: int) -> bytes:
    # Mark names are fixed ASCII words: formatted directly, faster than a JSON encoder per entry.
    return b'{"id":%d,"timestamps":[{"name":"%s","ns":%d}]}' % (trace_id, name.encode(), ns)


def _tensor_entry(trace_id: int, tensor: Any) -> bytes:
    return orjson.dumps(
        {
            "id": trace_id,
            "activity": tensor.activity,
            "tensor": {
                "name": tensor.name,
                "data": tensor.data,
                "shape": tensor.shape,
                "dtype": tensor.dtype,
            },
        }
    )


class TritonTraceFile:
    """Collects finished traces and writes them in Triton's JSON format."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.log_frequency = 0
        self._pending: list[bytes] = []  # each trace's entries, JSON-encoded, without brackets
        self._traces = 0
        self._index = 0

    def add(self, trace: RequestTrace) -> None:
        self.add_entries(trace_entries(trace))

    def add_entries(self, entries: bytes) -> None:
        """Keeps one trace's entries (`trace_entries`: made here, or in another worker)."""
        self._pending.append(entries)
        self._traces += 1
        if self.log_frequency and self._traces >= self.log_frequency:
            self.write_numbered()

    def write_numbered(self) -> None:
        """Writes the traces kept so far to `<file>.<n>` (nothing when none is kept)."""
        if not self._pending:
            return
        self._write(f"{self.path}.{self._index}")
        self._index += 1

    def close(self) -> None:
        """Writes what is left: to `<file>` unless numbered files were written."""
        if not self._pending:
            return
        if self._index or self.log_frequency:
            self.write_numbered()
        else:
            self._write(self.path)

    def _write(self, path: str) -> None:
        body = b"[" + b",".join(part for part in self._pending if part) + b"]"
        self._pending = []
        self._traces = 0
        try:
            Path(path).write_bytes(body)
        except OSError as exc:  # the file was writable at start-up; say once why it is not now
            logger.error("cannot write the trace file '%s': %s", path, exc.strerror)
