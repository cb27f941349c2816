"""The backend API: everything a backend plugin needs, and all that it may import.

A plugin module implements the `coreserve_register_backends` hook::

    from coreserve.backend import hookimpl

    @hookimpl
    def coreserve_register_backends(register):
        register.add(MyBackend())

and declares it as an entry point in the group `coreserve.backends`. See docs/backends.md.

Layer 2: may import coreserve's errors, types, config and generated protos; never the scheduling,
repository or server layers above it (they call backends, not the other way round).
"""

from __future__ import annotations

from coreserve.backend._base import BaseBackend
from coreserve.backend._threads import InstanceThread
from coreserve.backend.api import (
    Backend,
    InferenceClient,
    InstanceKind,
    InstancePlacement,
    LoadStopper,
    ModelControl,
    ModelFiles,
    ModelInstance,
    ServerActivity,
    ServerContext,
)
from coreserve.backend.custom_metrics import CustomMetric, CustomMetricFamily, CustomMetrics, MetricKind
from coreserve.backend.devices import DeviceReporter, cuda_driver_gpus
from coreserve.backend.parameters import (
    bool_parameter,
    choice_parameter,
    inline_below_us,
    int_parameter,
    str_parameter,
)
from coreserve.backend.plugins._commands import CommandRegistry
from coreserve.backend.plugins.hookspecs import hookimpl
from coreserve.backend.plugins.registry import BackendRegistry
from coreserve.backend.responder import Responder
from coreserve.backend.tensors._batching import run_batched
from coreserve.backend.tensors._model_tensors import (
    ModelTensor,
    check_model_tensors,
    complete_config,
    default_max_batch_size,
)
from coreserve.config.signature import ModelSignature, TensorSpec
from coreserve.types import is_request_field

__all__ = [
    "Backend",
    "BackendRegistry",
    "BaseBackend",
    "CommandRegistry",
    "CustomMetric",
    "CustomMetricFamily",
    "CustomMetrics",
    "DeviceReporter",
    "InferenceClient",
    "InstanceKind",
    "InstancePlacement",
    "InstanceThread",
    "LoadStopper",
    "MetricKind",
    "ModelControl",
    "ModelFiles",
    "ModelInstance",
    "ModelSignature",
    "ModelTensor",
    "Responder",
    "ServerActivity",
    "ServerContext",
    "TensorSpec",
    "bool_parameter",
    "check_model_tensors",
    "choice_parameter",
    "complete_config",
    "cuda_driver_gpus",
    "default_max_batch_size",
    "hookimpl",
    "inline_below_us",
    "int_parameter",
    "is_request_field",
    "run_batched",
    "str_parameter",
]
