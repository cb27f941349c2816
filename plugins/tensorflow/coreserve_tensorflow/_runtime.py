"""TensorFlow itself: imported when a model loads, its datatypes, its thread pools and its GPUs.

Imported when a model loads, not when the plugin registers."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from coreserve import DataType, ModelConfig
from coreserve.backend import int_parameter

# TensorFlow's C++ start-up lines (oneDNN, CPU features) are INFO; keep its warnings and errors.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import tensorflow as tf  # type: ignore[import-untyped]

__all__ = ["TF_TYPES", "apply_thread_pools", "tf", "type_name", "visible_gpus"]

logger = logging.getLogger("coreserve.backend.tensorflow")

TF_TYPES: dict[Any, DataType] = {
    tf.bool: DataType.BOOL,
    tf.uint8: DataType.UINT8,
    tf.uint16: DataType.UINT16,
    tf.uint32: DataType.UINT32,
    tf.uint64: DataType.UINT64,
    tf.int8: DataType.INT8,
    tf.int16: DataType.INT16,
    tf.int32: DataType.INT32,
    tf.int64: DataType.INT64,
    tf.float16: DataType.FP16,
    tf.float32: DataType.FP32,
    tf.float64: DataType.FP64,
    tf.bfloat16: DataType.BF16,
    tf.string: DataType.BYTES,
}

_THREAD_SETTERS = {
    "TF_NUM_INTRA_THREADS": (
        tf.config.threading.get_intra_op_parallelism_threads,
        tf.config.threading.set_intra_op_parallelism_threads,
    ),
    "TF_NUM_INTER_THREADS": (
        tf.config.threading.get_inter_op_parallelism_threads,
        tf.config.threading.set_inter_op_parallelism_threads,
    ),
}
_threads_lock = threading.Lock()


def apply_thread_pools(config: ModelConfig) -> None:
    """Sets TensorFlow's thread pools from TF_NUM_INTRA_THREADS / TF_NUM_INTER_THREADS.

    TensorFlow 2 has one pair of pools per process, fixed once it has run an operation: the
    first model that sets them decides; a later model asking for other sizes gets a warning.
    """
    with _threads_lock:
        for key, (current, setter) in _THREAD_SETTERS.items():
            wanted = int_parameter(config, key)
            if wanted is None or current() == wanted:
                continue
            try:
                setter(wanted)
            except RuntimeError:
                logger.warning(
                    "model '%s': %s=%d is not applied: TensorFlow's thread pools are per process and "
                    "already run with %d threads (0: TensorFlow's choice)",
                    config.name,
                    key,
                    wanted,
                    current(),
                )


def visible_gpus() -> list[int]:
    """The GPUs TensorFlow sees (none with the CPU build)."""
    return list(range(len(tf.config.list_physical_devices("GPU"))))


def type_name(dtype: Any) -> str:
    return str(getattr(dtype, "name", dtype))
