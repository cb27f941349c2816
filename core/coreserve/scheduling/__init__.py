"""Schedulers: per-model queues that form batches and feed a pool of instances."""

from __future__ import annotations

from coreserve.scheduling.scheduler import Scheduler

__all__ = ["Scheduler"]
