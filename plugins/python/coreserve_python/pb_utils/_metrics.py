"""Custom metrics of `triton_python_backend_utils`: `MetricFamily` and its `Metric`s.

A family and its metrics live in the server (on its metrics endpoint, beside its own
families) and go when the model unloads, or when the model lets go of the family, as in
Triton: a family deleted (its last reference gone) takes its metrics with it, and a `Metric`
still held then refuses every operation in Triton's words. Creating them asks the server, which checks names;
`increment`, `set` and `observe` are checked here against the kind and sent without waiting,
so a model that counts on every request pays no round trip; `value()` asks the server, which
has applied every update sent before it. Errors are TritonModelExceptions in Triton's words.
"""

from __future__ import annotations

import contextlib
import enum
import os
from typing import Any

import coreserve_python.pb_utils.runtime as _runtime
from coreserve_python.pb_utils._errors import TritonModelException


class MetricKind(enum.IntEnum):
    """The kinds of metric family (Triton's numbering)."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


def _triton_name(kind: MetricKind) -> str:
    return f"TRITONSERVER_METRIC_KIND_{kind.name}"


# Triton's words for an operation on a metric whose family was deleted.
DELETED_FAMILY_TEXT = (
    "Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The "
    "'MetricFamily' object should be deleted AFTER its corresponding 'Metric' objects have been "
    "deleted."
)


class Metric:
    """One metric of a family, identified by its labels. Its family keeps it (not the reverse,
    as in Triton): deleting the family clears it."""

    def __init__(self, kind: MetricKind, metric_id: int) -> None:
        self._kind = kind
        self._id = metric_id
        self._cleared = False

    def _clear(self) -> None:
        """Its family was deleted: the server drops it, and every operation now fails."""
        if not self._cleared:
            self._cleared = True
            _tell_if_served("metric_delete", {"metric": self._id})

    def _check(self, action: str, allowed: tuple[MetricKind, ...], what: str) -> None:
        if self._cleared:
            raise TritonModelException(f"{what}: {DELETED_FAMILY_TEXT}")
        kind = self._kind
        if kind not in allowed:
            raise TritonModelException(
                _runtime.require(f"Metric.{action}").failure(
                    what, f"{_triton_name(kind)} does not support {action.capitalize()}"
                )
            )

    def increment(self, value: float) -> None:
        """Adds `value` (counters: non-negative values only)."""
        self._check("increment", (MetricKind.COUNTER, MetricKind.GAUGE), "Failed to increment metric value")
        runtime = _runtime.require("Metric.increment")
        if self._kind is MetricKind.COUNTER and value < 0:
            raise TritonModelException(
                runtime.failure(
                    "Failed to increment metric value",
                    f"{_triton_name(MetricKind.COUNTER)} can only be incremented monotonically by "
                    "non-negative values.",
                )
            )
        runtime.tell("metric_update", {"metric": self._id, "action": "increment", "value": float(value)})

    def set(self, value: float) -> None:
        """Sets a gauge's value."""
        self._check("set", (MetricKind.GAUGE,), "Failed to set metric value")
        _runtime.require("Metric.set").tell(
            "metric_update", {"metric": self._id, "action": "set", "value": float(value)}
        )

    def observe(self, value: float) -> None:
        """Records an observation in a histogram."""
        self._check("observe", (MetricKind.HISTOGRAM,), "Failed to observe metric value")
        _runtime.require("Metric.observe").tell(
            "metric_update", {"metric": self._id, "action": "observe", "value": float(value)}
        )

    def value(self) -> float:
        """A counter's or gauge's current value."""
        self._check("value", (MetricKind.COUNTER, MetricKind.GAUGE), "Failed to get metric value")
        result: float = _runtime.require("Metric.value").ask(
            "metric_value", {"metric": self._id}, "Failed to get metric value"
        )
        return result


class MetricFamily:
    """A family of metrics on the server's metrics endpoint.

    :param name: the family's name (Prometheus' rules: letters, digits, `_` and `:`).
    :param description: its HELP text.
    :param kind: `MetricFamily.COUNTER`, `MetricFamily.GAUGE` or `MetricFamily.HISTOGRAM`.
    """

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: MetricKind) -> None:
        if not isinstance(name, str) or not isinstance(description, str) or not isinstance(kind, MetricKind):
            raise TypeError(
                "__init__(): incompatible constructor arguments. The following argument types are "
                "supported:\n    1. MetricFamily(name: str, description: str, kind: MetricKind)\n\n"
                f"Invoked with: {name!r}, {description!r}, {kind!r}"
            )
        self._kind = kind
        self._metrics: list[Metric] = []
        self._pid = os.getpid()  # (a process the model forked does not delete its parent's)
        self._id: int = _runtime.require("MetricFamily").ask(
            "metric_family",
            {"name": name, "description": description, "kind": kind.name.lower()},
            "Error when creating MetricFamily",
        )

    def Metric(self, labels: dict[str, Any] | None = None, buckets: list[float] | None = None) -> Metric:
        """The metric of this family with these labels; a histogram needs its bucket bounds."""
        if self._kind is MetricKind.HISTOGRAM and buckets is None:
            raise TritonModelException("Failed to create metric. Missing required buckets.")
        if self._kind is not MetricKind.HISTOGRAM and buckets is not None:
            raise TritonModelException("Failed to create metric. Unexpected buckets found.")
        metric_id: int = _runtime.require("MetricFamily.Metric").ask(
            "metric",
            {"family": self._id, "labels": dict(labels or {}), "buckets": list(buckets or [])},
            "Error when creating Metric",
        )
        metric = Metric(self._kind, metric_id)
        self._metrics.append(metric)
        return metric

    def __del__(self) -> None:
        # Deleted (its last reference gone): its metrics first, then itself, as Triton's.
        if getattr(self, "_id", None) is None or self._pid != os.getpid():
            return  # (its creation failed: the server has nothing of it; or a forked copy)
        for metric in self._metrics:
            metric._clear()
        _tell_if_served("metric_family_delete", {"family": self._id})


def _tell_if_served(op: str, fields: dict[str, Any]) -> None:
    """Tells the server, where a server runs the model and still listens (not at exit)."""
    runtime = _runtime.current()
    if runtime is not None:
        with contextlib.suppress(Exception):  # (a finalizer must not raise: the stub is ending)
            runtime.tell(op, fields)
