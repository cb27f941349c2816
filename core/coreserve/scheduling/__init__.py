"""Schedulers: per-model queues that form batches and feed a pool of instances."""

from __future__ import annotations

from coreserve.scheduling.scheduler import Scheduler
from coreserve.scheduling.statistics import LatencyOptions, ModelStatistics

__all__ = ["LatencyOptions", "ModelStatistics", "Scheduler"]
