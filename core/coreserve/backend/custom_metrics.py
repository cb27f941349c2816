"""Metric families that backends add to the server's metrics endpoint (Triton's custom metrics).

A backend gets the server's `CustomMetrics` as `ServerContext.metrics`. It creates families
(counter, gauge, histogram) and, in each, metrics identified by their labels; the metrics
endpoint writes them in Prometheus text beside the server's own families. A backend gives back
what it created when its model unloads (`CustomMetrics.release`): they leave the endpoint, or,
with `keep`, stay there with their values, as Triton keeps a Python model's, and a later load
that makes them again continues them. Errors are `InvalidArgumentError`s in Triton's words.
All calls happen on the event loop thread: no locking.
"""

from __future__ import annotations

import enum
import itertools
import math
import re
from collections.abc import Iterator, Mapping, Sequence

from coreserve.errors import InvalidArgumentError

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# The server's own families start so (Triton's nv_*, coreserve's own histograms).
RESERVED_PREFIXES = ("nv_", "coreserve_")


class MetricKind(enum.StrEnum):
    """The kinds of custom metric families (Prometheus type names)."""

    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"

    @property
    def triton_name(self) -> str:
        return f"TRITONSERVER_METRIC_KIND_{self.name}"


class CustomMetric:
    """One metric of a family: a value (counter, gauge) or a distribution (histogram)."""

    def __init__(self, family: CustomMetricFamily, labels: tuple[tuple[str, str], ...],
                 buckets: tuple[float, ...]) -> None:  # fmt: skip
        self.family = family
        self.labels = labels
        self.buckets = buckets
        self._value = 0.0
        self._counts = [0] * (len(buckets) + 1)  # per bucket, the last one +Inf
        self._sum = 0.0
        self.owners = 0

    def _unsupported(self, action: str) -> InvalidArgumentError:
        return InvalidArgumentError(f"{self.family.kind.triton_name} does not support {action}")

    def increment(self, value: float) -> None:
        """Adds `value` (a counter takes only non-negative values; not for histograms)."""
        kind = self.family.kind
        if kind is MetricKind.HISTOGRAM:
            raise self._unsupported("Increment")
        if kind is MetricKind.COUNTER and value < 0:
            raise InvalidArgumentError(
                f"{kind.triton_name} can only be incremented monotonically by non-negative values."
            )
        self._value += value

    def set(self, value: float) -> None:
        """Sets a gauge's value."""
        if self.family.kind is not MetricKind.GAUGE:
            raise self._unsupported("Set")
        self._value = value

    def observe(self, value: float) -> None:
        """Records one observation in a histogram."""
        if self.family.kind is not MetricKind.HISTOGRAM:
            raise self._unsupported("Observe")
        index = next((i for i, bound in enumerate(self.buckets) if value <= bound), len(self.buckets))
        self._counts[index] += 1
        self._sum += value

    def value(self) -> float:
        """A counter's or gauge's value."""
        if self.family.kind is MetricKind.HISTOGRAM:
            raise self._unsupported("Value")
        return self._value

    def samples(self) -> Iterator[str]:
        """This metric's lines in Prometheus text format."""
        name = self.family.name
        if self.family.kind is not MetricKind.HISTOGRAM:
            yield f"{name}{_label_text(self.labels)} {_number(self._value)}"
            return
        yield f"{name}_count{_label_text(self.labels)} {sum(self._counts)}"
        yield f"{name}_sum{_label_text(self.labels)} {_number(self._sum)}"
        running = 0
        for bound, count in zip([*self.buckets, math.inf], self._counts, strict=True):
            running += count
            yield f"{name}_bucket{_label_text((*self.labels, ('le', _number(bound))))} {running}"


class CustomMetricFamily:
    """A named family of metrics of one kind."""

    def __init__(self, name: str, description: str, kind: MetricKind) -> None:
        self.name = name
        self.description = description
        self.kind = kind
        self.metrics: dict[tuple[tuple[str, str], ...], CustomMetric] = {}
        self.owners = 0

    def metric(self, labels: Mapping[str, str], buckets: Sequence[float] | None = None) -> CustomMetric:
        """The metric with these labels (made on first use; each call adds an owner).

        A histogram needs its bucket bounds, strictly increasing; other kinds take none.
        """
        for name, text in labels.items():
            if not isinstance(name, str) or not _LABEL_NAME.fullmatch(name) or name.startswith("__"):
                raise InvalidArgumentError(f"Invalid label name '{name}'")
            if not isinstance(text, str):
                raise InvalidArgumentError("attempt to access JSON non-string as string")
        bounds = tuple(float(bound) for bound in buckets or ())
        if any(b >= c for b, c in itertools.pairwise(bounds)):
            raise InvalidArgumentError("Bucket Boundaries must be strictly sorted")
        key = tuple(sorted(labels.items()))
        metric = self.metrics.get(key)
        if metric is None:
            metric = self.metrics[key] = CustomMetric(self, key, bounds)
        metric.owners += 1
        return metric

    def release_metric(self, metric: CustomMetric, keep: bool = False) -> None:
        """Drops one owner of a metric; the metric goes when its last owner lets it go, unless
        `keep`: then it stays, with its value, for the next owner (who may let it go)."""
        metric.owners -= 1
        if metric.owners <= 0 and not keep:
            self.metrics.pop(metric.labels, None)

    def render(self) -> list[str]:
        if not self.metrics:
            return []  # as the server's own families: none without samples
        lines = [f"# HELP {self.name} {_escape_help(self.description)}", f"# TYPE {self.name} {self.kind}"]
        for metric in self.metrics.values():
            lines.extend(metric.samples())
        return lines


class CustomMetrics:
    """The server's custom metric families, written on the metrics endpoint."""

    def __init__(self) -> None:
        self._families: dict[str, CustomMetricFamily] = {}

    def family(self, name: str, description: str, kind: MetricKind) -> CustomMetricFamily:
        """The family of this name: made on first use, shared after (each call adds an owner).

        Raises InvalidArgumentError for a name Prometheus cannot carry, or a name already used
        with another kind.
        """
        if not _METRIC_NAME.fullmatch(name):
            raise InvalidArgumentError("Invalid metric name")
        if name.startswith(RESERVED_PREFIXES):
            # A second family of one of the server's names would break the whole scrape.
            raise InvalidArgumentError(
                f"metric family name '{name}' is reserved: names starting with "
                f"{' or '.join(RESERVED_PREFIXES)} are the server's own families"
            )
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = CustomMetricFamily(name, description, MetricKind(kind))
        elif family.kind is not kind:
            raise InvalidArgumentError("Family name already exists with different type")
        family.owners += 1
        return family

    def add_server_family(self, family: CustomMetricFamily) -> None:
        """Adds one of the server's own families (a frontend's): it may take a reserved name."""
        self._families[family.name] = family

    def release(self, family: CustomMetricFamily, keep: bool = False) -> None:
        """Drops one owner of a family; it leaves the endpoint when its last owner lets it go,
        unless `keep`: then it stays, with its metrics, for the next owner (who may let it go)."""
        family.owners -= 1
        if family.owners <= 0 and not keep and self._families.get(family.name) is family:
            del self._families[family.name]

    def render(self) -> str:
        """Every family in Prometheus text format 0.0.4 ('' when there is none)."""
        lines = [line for family in self._families.values() for line in family.render()]
        return "\n".join(lines) + "\n" if lines else ""


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _label_text(labels: Sequence[tuple[str, str]]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{key}="{_escape_label(value)}"' for key, value in labels) + "}"


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    """A sample value as Prometheus writes it: 3, 3.7, +Inf."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else repr(float(value))
