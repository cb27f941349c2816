"""Which GPUs a backend can place instances on: the one seam through which the core learns of devices.

The core depends on no GPU library, so it cannot count GPUs itself; a backend that can run
on GPUs knows (its framework sees CUDA devices or not) and reports them::

    class MyBackend(BaseBackend):
        def usable_gpus(self) -> Sequence[int]:
            import torch  # imported when a model loads, never at registration

            return range(torch.cuda.device_count()) if torch.cuda.is_available() else ()

With that report, instance groups are placed as Triton places them (see
`coreserve.config.instance_groups`): no `kind` or `KIND_AUTO` becomes GPU instances on every
reported GPU, or CPU instances when there is none; `KIND_GPU` without `gpus` means each
reported GPU; `KIND_GPU` when none is reported makes the model UNAVAILABLE with the reason. A
backend that does not report keeps the placement it always had (`KIND_AUTO` is CPU unless
`gpus` are listed; `KIND_GPU` without `gpus` is GPU 0).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from coreserve.errors import ModelConfigError


@runtime_checkable
class DeviceReporter(Protocol):
    """A backend that says which GPUs it can use (an optional part of the Backend protocol)."""

    def usable_gpus(self) -> Sequence[int]:
        """The ids of the GPUs this backend can run instances on, as CUDA numbers the visible
        ones (empty: none, so it runs on the CPU only). Called when a model of the backend
        loads, on a worker thread; cache the answer if finding it is slow."""
        ...


def reported_gpus(backend: object) -> tuple[int, ...] | None:
    """The GPU ids `backend` reports, sorted, or None when it does not report (see module doc).

    :param backend: a registered backend.
    :return: the ids, or None.
    """
    if not isinstance(backend, DeviceReporter):
        return None
    try:
        gpus = sorted({int(gpu) for gpu in backend.usable_gpus()})
    except Exception as exc:  # a framework failing to count its devices is the backend's fault
        name = getattr(backend, "name", type(backend).__name__)
        raise ModelConfigError(f"backend '{name}' cannot tell which GPUs it can use: {exc}") from None
    return tuple(gpus)


@functools.cache
def cuda_driver_gpus() -> tuple[int, ...]:
    """The ids of the GPUs the CUDA driver shows this process (`CUDA_VISIBLE_DEVICES` applies),
    for a backend whose framework has no device count of its own (Triton's core counts them so).

    Asks libcuda through ctypes (`cuInit`, `cuDeviceGetCount`), so it needs no GPU library;
    empty where there is no driver or no GPU. Found once per process.

    :return: 0 .. count-1, or ().
    """
    name = ctypes.util.find_library("cuda") or "libcuda.so.1"
    try:
        driver = ctypes.CDLL(name)
    except OSError:
        return ()
    count = ctypes.c_int(0)
    if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return ()  # no device, or a driver that cannot start: either way no GPU to use
    return tuple(range(count.value))
