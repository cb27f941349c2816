"""Prometheus metrics on `--metrics-port`: Triton's families, names, HELP texts and labels.

`_prometheus` renders the statistics the schedulers keep and the families backends add;
`_system_metrics` polls CPU (from /proc) and GPU (through NVML). May import the scheduling statistics
and the backend API's metric families; nothing of the other frontends.
"""

from __future__ import annotations

from coreserve.server.metrics._prometheus import MetricsFrontend, MetricsReport

__all__ = ["MetricsFrontend", "MetricsReport"]
